//! The shared vocabulary: what every layer of weir-core speaks, and what uses
//! nothing of the layers below it (the engines, the driver, the client side).
//!
//! [`ids`] and [`error`] name things and failures (errors cross the wire);
//! [`wire`] is the protocol; [`buf`] the buffer pool and [`copies`] the count of
//! payload copies; [`io`] the device commands the engines issue; [`device`] and
//! [`transport`] the two seams; [`events`] the node's typed events; [`time`] the
//! cluster clock; [`record`] the framed records of durable metadata files;
//! [`map`] the cluster map as the data path reads it (its state is the control
//! plane's, [`crate::control::state`]).

pub mod buf;
pub mod copies;
pub mod device;
pub mod error;
pub mod events;
pub mod ids;
pub mod io;
pub mod map;
pub mod record;
pub mod time;
pub mod transport;
pub mod wire;
