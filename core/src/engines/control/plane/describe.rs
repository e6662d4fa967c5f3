//! The report line of an applied command: the control plane's events.

use crate::control::state::{ClusterState, Command, ConfRole};

/// The event of an applied `command` that changed the map, if it is one worth
/// reporting.
///
/// One table, argued long: an arm per command worth an event.
pub(super) fn describe(
    command: &Command,
    changes: &[crate::control::state::Change],
    state: &ClusterState,
) -> Option<crate::events::Event> {
    use crate::control::state::Change;
    use crate::events::{Event, MemberChange};
    let member = |node, change| Event::Member { node, change };
    let (mut failovers, mut replicas, mut unavailable) = (0, 0, 0);
    for c in changes {
        match c {
            Change::Failover(f) => failovers += f.len(),
            Change::Replicas(r) => replicas += r.len(),
            Change::Unavailable(u) => unavailable += u.len(),
            Change::Membership | Change::Moved { .. } => {}
        }
    }
    match command {
        Command::NodeDown { node, .. } => Some(Event::NodeDown {
            node: *node,
            failovers,
            lost_replica: replicas,
            unavailable,
        }),
        Command::NodeUp { node } => Some(Event::NodeUp {
            node: *node,
            rebuilding: replicas,
        }),
        Command::DropReplica { extent, node, .. } => Some(Event::ReplicaDropped {
            node: *node,
            extent: *extent,
        }),
        Command::CreateNamed {
            name, size_bytes, ..
        } => Some(Event::VolumeCreated {
            name: name.clone(),
            size_bytes: *size_bytes,
        }),
        Command::DeleteNamed { name } => Some(Event::VolumeDeleted { name: name.clone() }),
        Command::SetQos { name, qos } => Some(Event::VolumeQos {
            name: name.clone(),
            qos: *qos,
        }),
        Command::Restarted { node, .. } => Some(Event::Restarted {
            node: *node,
            moved: replicas + failovers,
            failovers,
        }),
        Command::ReplaceNode { node } => Some(Event::Replaced {
            node: *node,
            rebuilding: replicas,
        }),
        Command::JoinNode { node, .. } => Some(member(*node, MemberChange::Joined)),
        Command::RemoveNode { node } => Some(member(
            *node,
            MemberChange::Leaving {
                extents: state.replicas_on(*node).0,
            },
        )),
        Command::MoveReplica {
            extent, from, to, ..
        } => Some(member(
            *from,
            MemberChange::MoveStarted {
                extent: *extent,
                to: *to,
            },
        )),
        Command::FinishMove { .. } => changes.iter().find_map(|c| match c {
            Change::Moved { extent, from, to } => Some(member(
                *from,
                MemberChange::Moved {
                    extent: *extent,
                    to: *to,
                },
            )),
            _ => None,
        }),
        Command::Conf { node, role } => Some(member(
            *node,
            match role {
                ConfRole::Voter => MemberChange::Voter,
                ConfRole::Learner => MemberChange::Learner,
                ConfRole::Gone => MemberChange::Gone,
            },
        )),
        _ => None,
    }
}
