//! The scenario's choices among named options (the fabric's transport, DCQCN
//! preset and CNP mode, the hosts' network stack, the NVMe driver): each an
//! enum, named in TOML and in the report as the one table below says.

use serde::Deserialize;

/// An enum whose variants are named in TOML (and printed) as given.
macro_rules! choice {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every option, in the table's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// Its name in TOML.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

choice! {
    /// What carries the nodes' frames.
    Transport {
        /// Lossless RoCE v2: PFC and DCQCN.
        Roce = "roce",
        /// The same fabric, frames carried by RDMA's messenger (connections,
        /// credits, granted regions).
        Rdma = "rdma",
        /// The lossy TCP baseline with Reno (no PFC, no DCQCN, ECN at K).
        TcpReno = "tcp-reno",
        /// The lossy TCP baseline with DCTCP.
        TcpDctcp = "tcp-dctcp",
        /// The lossy TCP baseline with CUBIC.
        TcpCubic = "tcp-cubic",
    }
}

choice! {
    /// How a client host reaches its volumes.
    ClientPath {
        /// Through a storage node's own front end, as NBD's and NVMe-oF's
        /// hosts do: each request over the fabric to that node, which sends
        /// it on to the extents' primaries.
        FrontEnd = "front-end",
        /// weir-core's front end on the host itself (a compute host running
        /// weir's client library): each request straight to its primaries,
        /// whose answers converge on the host's port.
        Library = "library",
    }
}

impl Transport {
    /// Whether it is RoCE's lossless fabric (PFC and DCQCN), with or
    /// without RDMA's messenger.
    pub fn lossless(self) -> bool {
        matches!(self, Transport::Roce | Transport::Rdma)
    }
}

choice! {
    /// The DCQCN reaction point's preset.
    Dcqcn {
        /// HPCC's settings.
        Hpcc = "hpcc",
        /// The DCQCN paper's.
        Paper = "paper",
        /// A ConnectX NIC's defaults.
        Connectx = "connectx",
        /// No rate control.
        Off = "off",
    }
}

choice! {
    /// How a receiving NIC generates congestion notifications.
    Cnp {
        /// At most one per QP per 50 us.
        PerQp = "per-qp",
        /// One per marked packet.
        PerPacket = "per-packet",
    }
}

choice! {
    /// The hosts' network stack, charged on their CPU.
    NetworkStack {
        /// Free.
        None = "none",
        /// The kernel's TCP stack.
        KernelTcp = "kernel-tcp",
        /// Verbs.
        Rdma = "rdma",
    }
}

choice! {
    /// The storage nodes' NVMe driver, charged on their CPU.
    Driver {
        /// Free.
        None = "none",
        /// The kernel's, with interrupts.
        Kernel = "kernel",
        /// A user-space driver on a polling core of its own.
        Polled = "polled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_reads_back_from_its_name() {
        #[derive(Deserialize)]
        struct T {
            t: Transport,
        }
        for &t in Transport::ALL {
            let parsed: T = toml::from_str(&format!("t = \"{t}\"")).unwrap();
            assert_eq!(parsed.t, t);
        }
        assert!(toml::from_str::<T>("t = \"ethernet\"").is_err());
        assert_eq!(Transport::TcpDctcp.as_str(), "tcp-dctcp");
        assert_eq!(Cnp::PerQp.to_string(), "per-qp");
        assert_eq!(ClientPath::FrontEnd.as_str(), "front-end");
        assert!(!Transport::TcpCubic.lossless() && Transport::Rdma.lossless());
    }
}
