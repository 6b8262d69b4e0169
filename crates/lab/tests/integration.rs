//! The lab's integration tests, in one test binary (one link instead of one per file): each
//! file below is a module and keeps its tests' names.

mod controllers;
mod dns;
mod hang;
mod kubectl_e2e;
mod lab;
mod metrics;
mod network;
