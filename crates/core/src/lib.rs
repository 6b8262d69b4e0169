//! Pure domain logic of Tandem: no I/O, no kube. Callers persist the state these types return.

pub mod grant;
pub mod invite;
pub mod ipam;
pub mod mcs;
pub mod nat;
pub mod offloading;
pub mod prefix;
pub mod shadow;
pub mod storage;
