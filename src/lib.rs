//! The `agentd` daemon as a library: the configuration file and the built-in runtime that
//! does the work the sans-io core hands out as effects. The binary (`src/main.rs`) wires
//! them to a driver; tests and fuzz targets reach them here.

pub mod config;
pub mod console;
pub mod durable;
pub mod logjson;
pub mod memory;
pub mod metrics;
pub mod printconfig;
pub mod reload;
pub mod runtime;
pub mod store;
pub mod telemetry;
