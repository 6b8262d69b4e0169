//! Peering invites: the single string a provider's admin hands out of band. It carries the
//! provider's cluster ID, API endpoint and CA, and a short-lived bootstrap token
//! (`<id>.<secret>`); this module encodes, decodes and checks it, and computes the proof a
//! consumer files with its peering request. Pure: the caller supplies the clock.
//!
//! Format: `tandem-invite-v1.` + base64url(JSON payload) + `.` + 8 hex digits of the payload's
//! SHA-256, so a truncated or mistyped string fails with a clear message instead of a
//! confusing authentication error later.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Prefix of every invite this version writes and reads.
pub const PREFIX: &str = "tandem-invite-v1.";
/// Length of a bootstrap token ID and secret (Kubernetes' format: `[a-z0-9]{6}.[a-z0-9]{16}`).
pub const TOKEN_ID_LEN: usize = 6;
pub const TOKEN_SECRET_LEN: usize = 16;

/// What an invite says.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeeringInvite {
    /// The provider's cluster ID.
    #[serde(rename = "providerClusterID")]
    pub provider_cluster_id: String,
    /// The provider's API endpoint (https://host:port).
    pub endpoint: String,
    /// PEM of the CA that signs the provider's API serving certificate.
    pub ca_data: String,
    /// Public half of the bootstrap token (names the token and the peering request).
    #[serde(rename = "tokenID")]
    pub token_id: String,
    /// Secret half of the bootstrap token.
    pub token_secret: String,
    /// Expiry, seconds since the Unix epoch.
    pub expires: i64,
    /// The peering protocol the provider speaks (`crate::protocol`); invites written before
    /// it was carried are v1.
    #[serde(default = "crate::protocol::unversioned")]
    pub protocol_version: u32,
}

impl std::fmt::Debug for PeeringInvite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token secret is a credential: never print it.
        f.debug_struct("PeeringInvite")
            .field("provider_cluster_id", &self.provider_cluster_id)
            .field("endpoint", &self.endpoint)
            .field("token_id", &self.token_id)
            .field("expires", &self.expires)
            .finish()
    }
}

/// Why an invite string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InviteError {
    #[error("not a Tandem invite (it should start with {PREFIX:?}; was it copied whole?)")]
    NotAnInvite,
    #[error("invite version {0:?} is not supported by this tandem (it reads v1); upgrade tandem")]
    UnsupportedVersion(String),
    #[error("the invite is truncated or damaged (checksum mismatch); copy it again")]
    Checksum,
    #[error("the invite is damaged: {0}")]
    Malformed(String),
    #[error("the invite expired {} ago; ask the provider for a new one", human_duration(*.ago_secs))]
    Expired { ago_secs: i64 },
    #[error(transparent)]
    Protocol(#[from] crate::protocol::Unsupported),
}

impl PeeringInvite {
    /// The bearer token the apiserver authenticates: `<id>.<secret>`.
    pub fn bearer_token(&self) -> String {
        format!("{}.{}", self.token_id, self.token_secret)
    }

    /// The invite string.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("invite serializes");
        let payload = URL_SAFE_NO_PAD.encode(json);
        format!("{PREFIX}{payload}.{}", checksum(&payload))
    }

    /// Parses and checks an invite string (not its expiry: see [`PeeringInvite::check_expiry`]).
    pub fn decode(s: &str) -> Result<PeeringInvite, InviteError> {
        let s = s.trim();
        let Some(rest) = s.strip_prefix(PREFIX) else {
            if let Some(v) = s
                .strip_prefix("tandem-invite-")
                .and_then(|r| r.split('.').next())
            {
                return Err(InviteError::UnsupportedVersion(v.to_string()));
            }
            return Err(InviteError::NotAnInvite);
        };
        let (payload, sum) = rest.rsplit_once('.').ok_or(InviteError::Checksum)?;
        if checksum(payload) != sum {
            return Err(InviteError::Checksum);
        }
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|e| InviteError::Malformed(format!("base64: {e}")))?;
        let invite: PeeringInvite = serde_json::from_slice(&json)
            .map_err(|e| InviteError::Malformed(format!("payload: {e}")))?;
        invite.validate()?;
        Ok(invite)
    }

    /// Checks the fields' shapes.
    pub fn validate(&self) -> Result<(), InviteError> {
        let bad = |m: String| Err(InviteError::Malformed(m));
        if !valid_token_part(&self.token_id, TOKEN_ID_LEN) {
            return bad(format!("token ID {:?} is not 6 of [a-z0-9]", self.token_id));
        }
        if !valid_token_part(&self.token_secret, TOKEN_SECRET_LEN) {
            return bad("token secret is not 16 of [a-z0-9]".into());
        }
        if self.provider_cluster_id.is_empty() {
            return bad("empty provider cluster ID".into());
        }
        if !self.endpoint.starts_with("https://") {
            return bad(format!("endpoint {:?} is not https://", self.endpoint));
        }
        if !self.ca_data.contains("BEGIN CERTIFICATE") {
            return bad("the CA is not a PEM certificate".into());
        }
        crate::protocol::check("provider", self.protocol_version)?;
        Ok(())
    }

    /// Refuses an expired invite, saying how long ago it expired.
    pub fn check_expiry(&self, now_unix: i64) -> Result<(), InviteError> {
        if now_unix >= self.expires {
            return Err(InviteError::Expired {
                ago_secs: now_unix - self.expires,
            });
        }
        Ok(())
    }
}

/// Whether `s` is `len` characters of `[a-z0-9]`.
pub fn valid_token_part(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Whether `s` is a whole bootstrap token, `<id>.<secret>`.
pub fn valid_bearer_token(s: &str) -> bool {
    s.split_once('.').is_some_and(|(id, secret)| {
        valid_token_part(id, TOKEN_ID_LEN) && valid_token_part(secret, TOKEN_SECRET_LEN)
    })
}

fn checksum(payload: &str) -> String {
    let digest = Sha256::digest(payload.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// Proof that the filer of a peering request holds the whole token: hex HMAC-SHA256 keyed with
/// the token secret over `clusterID|tokenID|csr`.
pub fn token_proof(
    token_secret: &str,
    consumer_cluster_id: &str,
    token_id: &str,
    csr: &str,
) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(token_secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(consumer_cluster_id.as_bytes());
    mac.update(b"|");
    mac.update(token_id.as_bytes());
    mac.update(b"|");
    mac.update(csr.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a proof in constant time.
pub fn verify_token_proof(
    token_secret: &str,
    consumer_cluster_id: &str,
    token_id: &str,
    csr: &str,
    proof: &str,
) -> bool {
    let expected = token_proof(token_secret, consumer_cluster_id, token_id, csr);
    expected.len() == proof.len()
        && expected
            .bytes()
            .zip(proof.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// "45s", "3m", "2h5m", "3d": how people say a duration.
pub fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 if s % 3600 / 60 == 0 => format!("{}h", s / 3600),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invite() -> PeeringInvite {
        PeeringInvite {
            provider_cluster_id: "milan".into(),
            endpoint: "https://127.0.0.1:6443".into(),
            ca_data: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            token_id: "abc123".into(),
            token_secret: "0123456789abcdef".into(),
            expires: 1_000,
            protocol_version: crate::protocol::VERSION,
        }
    }

    #[test]
    fn an_invite_written_before_the_protocol_version_reads_as_v1() {
        let mut json = serde_json::to_value(invite()).unwrap();
        json.as_object_mut().unwrap().remove("protocolVersion");
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&json).unwrap());
        let old = format!("{PREFIX}{payload}.{}", checksum(&payload));
        assert_eq!(PeeringInvite::decode(&old).unwrap().protocol_version, 1);
    }

    #[test]
    fn round_trip() {
        let s = invite().encode();
        assert!(s.starts_with(PREFIX));
        assert_eq!(PeeringInvite::decode(&s).unwrap(), invite());
        assert_eq!(
            PeeringInvite::decode(&format!("  {s}\n")).unwrap(),
            invite()
        );
        assert_eq!(invite().bearer_token(), "abc123.0123456789abcdef");
        assert!(!format!("{:?}", invite()).contains("0123456789abcdef"));
    }

    #[test]
    fn refusals() {
        let good = invite().encode();
        let mut tampered = good.clone().into_bytes();
        let i = PREFIX.len() + 5;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        let bad_fields = |f: fn(&mut PeeringInvite)| {
            let mut i = invite();
            f(&mut i);
            i.encode()
        };
        let cases: Vec<(&str, String, InviteError)> = vec![
            ("empty", String::new(), InviteError::NotAnInvite),
            ("garbage", "hello".into(), InviteError::NotAnInvite),
            (
                "wrong version",
                good.replace("-v1.", "-v2."),
                InviteError::UnsupportedVersion("v2".into()),
            ),
            (
                "truncated",
                good[..good.len() - 10].to_string(),
                InviteError::Checksum,
            ),
            ("tampered", tampered, InviteError::Checksum),
            (
                "a protocol this build cannot speak",
                bad_fields(|i| i.protocol_version = 99),
                InviteError::Protocol(crate::protocol::Unsupported {
                    peer: "provider",
                    theirs: 99,
                }),
            ),
            (
                "no checksum",
                good[..good.rfind('.').unwrap()].to_string(),
                InviteError::Checksum,
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(PeeringInvite::decode(&s).unwrap_err(), want, "{name}");
        }
        let malformed = [
            ("short token id", bad_fields(|i| i.token_id = "abc".into())),
            (
                "upper-case secret",
                bad_fields(|i| i.token_secret = "0123456789ABCDEF".into()),
            ),
            (
                "http endpoint",
                bad_fields(|i| i.endpoint = "http://x".into()),
            ),
            ("no CA", bad_fields(|i| i.ca_data = String::new())),
            (
                "no cluster",
                bad_fields(|i| i.provider_cluster_id = String::new()),
            ),
        ];
        for (name, s) in malformed {
            assert!(
                matches!(PeeringInvite::decode(&s), Err(InviteError::Malformed(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn expiry() {
        let i = invite();
        assert!(i.check_expiry(999).is_ok());
        let err = i.check_expiry(1_000 + 180).unwrap_err();
        assert_eq!(err, InviteError::Expired { ago_secs: 180 });
        assert_eq!(
            err.to_string(),
            "the invite expired 3m ago; ask the provider for a new one"
        );
    }

    #[test]
    fn durations() {
        for (secs, want) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (3599, "59m"),
            (3600, "1h"),
            (3900, "1h5m"),
            (86400 * 2, "2d"),
            (-5, "0s"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn proofs() {
        let p = token_proof("0123456789abcdef", "rome", "abc123", "CSR");
        assert_eq!(p.len(), 64);
        assert!(verify_token_proof(
            "0123456789abcdef",
            "rome",
            "abc123",
            "CSR",
            &p
        ));
        for (secret, cluster, id, csr) in [
            ("0123456789abcdee", "rome", "abc123", "CSR"),
            ("0123456789abcdef", "romf", "abc123", "CSR"),
            ("0123456789abcdef", "rome", "abc124", "CSR"),
            ("0123456789abcdef", "rome", "abc123", "CSS"),
        ] {
            assert!(
                !verify_token_proof(secret, cluster, id, csr, &p),
                "{secret} {cluster} {id} {csr}"
            );
        }
    }
}
