//! Pure domain logic of Tandem: no I/O, no kube. Callers persist the state these types return.

pub mod discovery;
pub mod enrollment;
pub mod errors;
pub mod fence;
pub mod grant;
pub mod invite;
pub mod ipam;
pub mod mcs;
pub mod names;
pub mod nat;
pub mod offloading;
pub mod peer_writes;
pub mod pod_admission;
pub mod pod_resources;
pub mod prefix;
pub mod protocol;
pub mod shadow;
pub mod storage;
