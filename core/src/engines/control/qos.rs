//! A named volume's quality of service, as the cluster map holds it: dmClock's
//! three controls (reservation, weight, limit), plus a bandwidth limit. Every
//! primary enforces them ([`crate::sched::Admission`]); what a client carries
//! makes them hold across primaries, not per primary.

use serde::{Deserialize, Serialize};

/// Highest IOPS figure a volume may name (reservation or limit).
pub const QOS_IOPS_MAX: u64 = 100_000_000;
/// Highest bandwidth limit, bytes per second (1 TB/s).
pub const QOS_BW_MAX: u64 = 1 << 40;
/// Highest weight.
pub const QOS_WEIGHT_MAX: u32 = 10_000;
/// The weight of a volume that names none.
pub const QOS_WEIGHT_DEFAULT: u32 = 100;

/// A volume's QoS. Zero for a reservation or a limit means none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    /// Most I/O requests per second, over the whole cluster.
    pub iops_limit: u64,
    /// Most bytes per second, over the whole cluster.
    pub bw_limit: u64,
    /// I/O requests per second the volume gets whatever else runs, as long as
    /// the cluster can serve them.
    pub iops_reservation: u64,
    /// Its share of what is left beyond reservations, relative to other volumes.
    pub weight: u32,
}

impl Default for Qos {
    fn default() -> Self {
        Qos {
            iops_limit: 0,
            bw_limit: 0,
            iops_reservation: 0,
            weight: QOS_WEIGHT_DEFAULT,
        }
    }
}

/// Why a QoS setting is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum QosError {
    /// A figure past its bound.
    #[error("{0} is past its bound")]
    TooLarge(&'static str),
    /// Weight zero.
    #[error("the weight is 1 to 10000")]
    ZeroWeight,
    /// A reservation above the limit cannot be kept.
    #[error("the reservation ({reservation} IOPS) is above the limit ({limit} IOPS)")]
    ReservationAboveLimit {
        /// IOPS reserved.
        reservation: u64,
        /// IOPS limit.
        limit: u64,
    },
}

impl Qos {
    /// Check the setting.
    pub fn check(&self) -> Result<(), QosError> {
        if self.iops_limit > QOS_IOPS_MAX {
            return Err(QosError::TooLarge("the IOPS limit"));
        }
        if self.iops_reservation > QOS_IOPS_MAX {
            return Err(QosError::TooLarge("the IOPS reservation"));
        }
        if self.bw_limit > QOS_BW_MAX {
            return Err(QosError::TooLarge("the bandwidth limit"));
        }
        if self.weight == 0 {
            return Err(QosError::ZeroWeight);
        }
        if self.weight > QOS_WEIGHT_MAX {
            return Err(QosError::TooLarge("the weight"));
        }
        if self.iops_limit != 0 && self.iops_reservation > self.iops_limit {
            return Err(QosError::ReservationAboveLimit {
                reservation: self.iops_reservation,
                limit: self.iops_limit,
            });
        }
        Ok(())
    }

    /// Whether the volume asks for anything beyond the default.
    pub fn is_set(&self) -> bool {
        *self != Qos::default()
    }
}

impl std::fmt::Display for Qos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_none = |v: u64| match v {
            0 => "none".to_string(),
            v => v.to_string(),
        };
        write!(
            f,
            "iops_limit={} bw_limit={} iops_reservation={} weight={}",
            or_none(self.iops_limit),
            or_none(self.bw_limit),
            or_none(self.iops_reservation),
            self.weight
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert_eq!(Qos::default().check(), Ok(()));
        assert!(!Qos::default().is_set());
        let q = |iops_limit, iops_reservation, weight| Qos {
            iops_limit,
            bw_limit: 0,
            iops_reservation,
            weight,
        };
        assert_eq!(q(1000, 500, 1).check(), Ok(()));
        assert!(q(1000, 500, 1).is_set());
        assert_eq!(q(0, 500, 100).check(), Ok(()));
        assert_eq!(
            q(100, 500, 100).check(),
            Err(QosError::ReservationAboveLimit {
                reservation: 500,
                limit: 100
            })
        );
        assert_eq!(q(0, 0, 0).check(), Err(QosError::ZeroWeight));
        assert!(q(0, 0, QOS_WEIGHT_MAX + 1).check().is_err());
        assert!(q(QOS_IOPS_MAX + 1, 0, 1).check().is_err());
        let bw = Qos {
            bw_limit: QOS_BW_MAX + 1,
            ..Qos::default()
        };
        assert!(bw.check().is_err());
    }
}
