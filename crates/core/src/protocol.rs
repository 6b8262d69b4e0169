//! The peering protocol's version: what a consumer and a provider exchange (the invite, the
//! peering request, the negotiation objects). The invite, and the peering request filed with
//! it, say which version their side speaks, and a side refuses a version it cannot speak with a
//! message naming both, before anything else is created.

/// The version this build speaks (and writes).
pub const VERSION: u32 = 1;

/// The versions this build can peer with.
pub const SUPPORTED: std::ops::RangeInclusive<u32> = 1..=VERSION;

/// Objects written before the version was carried are version 1.
pub fn unversioned() -> u32 {
    1
}

/// Why a peer's protocol version is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {peer} speaks peering protocol v{theirs}, and this tandem speaks {}; upgrade the older \
     side",
    speaks()
)]
pub struct Unsupported {
    /// Who sent it: "provider" or "consumer".
    pub peer: &'static str,
    pub theirs: u32,
}

/// What this build speaks, as people read it ("v1", "v1–v2").
pub fn speaks() -> String {
    if SUPPORTED.start() == SUPPORTED.end() {
        format!("v{}", SUPPORTED.start())
    } else {
        format!("v{}–v{}", SUPPORTED.start(), SUPPORTED.end())
    }
}

/// Refuses a version this build cannot speak; `peer` names who sent it.
pub fn check(peer: &'static str, theirs: u32) -> Result<(), Unsupported> {
    if SUPPORTED.contains(&theirs) {
        Ok(())
    } else {
        Err(Unsupported { peer, theirs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_version_passes_and_others_are_refused_naming_both() {
        assert_eq!(check("provider", VERSION), Ok(()));
        assert_eq!(check("provider", unversioned()), Ok(()));
        let e = check("consumer", VERSION + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the consumer speaks peering protocol v{}, and this tandem speaks v{VERSION}; \
                 upgrade the older side",
                VERSION + 1
            )
        );
        assert!(check("provider", 0).is_err());
    }
}
