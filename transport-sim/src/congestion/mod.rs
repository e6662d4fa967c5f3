//! Congestion response (DESIGN.md section 4.2), as the fabric model runs it.
//!
//! [`dcqcn`]: the DCQCN reaction and notification points as pure logic; the
//! simulated NIC runs them per QP, and on real NICs the same parameters are the ones
//! pushed to the firmware.
//!
//! [`tcp`]: TCP congestion control (Reno, DCTCP, Cubic) as pure logic, for the TCP
//! baseline on the same simulated fabric.

pub mod dcqcn;
pub mod tcp;
