//! Pure domain logic of Tandem: no I/O, no kube. Callers persist the state these types return.

pub mod discovery;
pub mod fence;
pub mod grant;
pub mod invite;
pub mod ipam;
pub mod mcs;
pub mod nat;
pub mod offloading;
pub mod pod_admission;
pub mod pod_resources;
pub mod prefix;
pub mod protocol;
pub mod shadow;
pub mod storage;

/// A short, stable hash of `s` (32-bit FNV-1a, eight hex digits) for names derived from
/// longer ones: the same on every build and platform, unlike std's hasher, which matters
/// because two controllers (or two versions of one) must derive the same name.
pub fn short_hash(s: &str) -> String {
    let hash = s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}
