//! The CLI's tests, in one test binary (one link instead of one per file): each file below is
//! a module and keeps its tests' names. They run the built `tandem` binary as a user would.

mod advertise_cli;
mod apiserver_crash;
mod check_cli;
mod completion_cli;
mod controller_sigkill;
mod dashboard_cli;
mod discover_cli;
mod enroll_cli;
mod fabric_cli;
mod image_cli;
mod incluster_cli;
mod kind_cli;
mod kind_e2e;
mod lab_cli;
mod lab_network_cli;
mod manifests_cli;
mod mcs_cli;
mod mdns_cli;
mod netlab;
mod offload_cli;
mod offloaded_pods_cli;
mod peering_cli;
mod readme;
mod rotate_cli;
#[path = "../../controller/tests/support/mod.rs"]
mod support;
mod uninstall_cli;
