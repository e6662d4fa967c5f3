//! What the engine asks its driver to do: [`Action`] out of
//! [`super::Replicator::poll_action`], an [`IoCmd`] in an `Action::Io`, its
//! [`IoResult`] back into [`super::Replicator::handle_io`] (the I/O types are
//! the shared vocabulary's, [`crate::vocab::io`]).

use super::*;

/// Something the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `msg` to `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// The message.
        msg: Message,
    },
    /// Issue a device command and report it back with [`Replicator::handle_io`].
    Io {
        /// Id to report the completion under.
        io: IoId,
        /// The command.
        cmd: IoCmd,
    },
    /// Ask the control plane to commit `command` (a primary dropping a replica that
    /// did not acknowledge in time).
    Control {
        /// The command.
        command: crate::control::Command,
    },
    /// A fact for the invariant checkers (only with [`ReplicationConfig::audit`]).
    Audit(Audit),
    /// Something worth a line in the node's event log (a rebuild finished).
    Event(crate::events::Event),
    /// Write down these block versions, durable now (see `checkpoint`): a full
    /// checkpoint replaces what was written before, a delta is appended to it.
    Checkpoint {
        /// Runs of blocks at one version; version 0: forgotten.
        runs: Vec<crate::replication::versions::VersionRun>,
        /// Whether this is every version the node holds.
        full: bool,
    },
}

/// A completion with no data, or its error.
pub(super) fn io_unit(result: IoResult) -> Result<(), WeirError> {
    match result {
        IoResult::Done | IoResult::Read(_) => Ok(()),
        IoResult::Failed(e) => Err(e),
    }
}

/// A read's data, or its error.
pub(super) fn io_data(result: IoResult) -> Result<Bytes, WeirError> {
    match result {
        IoResult::Read(data) => Ok(data),
        IoResult::Failed(e) => Err(e),
        IoResult::Done => panic!("a read completed without data"),
    }
}
