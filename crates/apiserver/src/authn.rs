//! Authentication: client certificates, the static admin token, ServiceAccount tokens and
//! bootstrap tokens. A request with no credentials at all is `system:anonymous`, as with
//! kube-apiserver's default `--anonymous-auth=true`; RBAC then decides what it may do.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use serde_json::{Value, json};
use sha2::Sha256;
use tandem_apimachinery::rbac::UserInfo;

use crate::state::State;

/// Who a connection authenticated as with its client certificate.
#[derive(Clone, Debug, Default)]
pub struct PeerIdentity(pub Option<UserInfo>);

/// The user a verified client certificate names: CN is the user, each O a group.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(UserInfo { name, groups })
}

/// The user a request without credentials is, as kube-apiserver names it.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// The group of every anonymous request (never system:authenticated).
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// The identity of a request that presents no credentials.
pub fn anonymous() -> UserInfo {
    UserInfo {
        name: ANONYMOUS_USER.into(),
        groups: vec![UNAUTHENTICATED_GROUP.into()],
    }
}

/// Authenticates a request; None means 401. Credentials that fail are a 401, never a fall
/// back to anonymous (kube's union authenticator fails on error the same way).
pub fn authenticate(state: &State, peer: &PeerIdentity, headers: &HeaderMap) -> Option<UserInfo> {
    let authorization = headers.get(http::header::AUTHORIZATION);
    let bearer = authorization
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let mut user = match (bearer, &peer.0) {
        (Some(token), _) => authenticate_token(state, token)?,
        (None, Some(user)) => user.clone(),
        (None, None) if authorization.is_none() => return Some(anonymous()),
        (None, None) => return None,
    };
    if !user.groups.iter().any(|g| g == "system:authenticated") {
        user.groups.push("system:authenticated".into());
    }
    Some(user)
}

/// Authenticates a bearer token (also used by TokenReview).
pub fn authenticate_token(state: &State, token: &str) -> Option<UserInfo> {
    if !state.admin_token.is_empty() && token == state.admin_token {
        return Some(UserInfo {
            name: "admin".into(),
            groups: vec!["system:masters".into()],
        });
    }
    if let Some(user) = bootstrap_token(state, token) {
        return Some(user);
    }
    service_account_token(state, token)
}

/// `<id>.<secret>` matched against a `bootstrap.kubernetes.io/token` Secret in kube-system.
fn bootstrap_token(state: &State, token: &str) -> Option<UserInfo> {
    let (id, secret) = token.split_once('.')?;
    let valid = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !valid(id, 6) || !valid(secret, 16) {
        return None;
    }
    let doc = state
        .store
        .get("/secrets", "kube-system", &format!("bootstrap-token-{id}"))?;
    let obj = doc.value();
    if obj["type"] != "bootstrap.kubernetes.io/token" {
        return None;
    }
    let data = |k: &str| -> Option<String> {
        obj["data"][k]
            .as_str()
            .and_then(|v| STANDARD.decode(v).ok())
            .and_then(|b| String::from_utf8(b).ok())
            .or_else(|| obj["stringData"][k].as_str().map(str::to_string))
    };
    // Constant-time compare: the secret is a credential.
    let expected = data("token-secret")?;
    if data("token-id").as_deref() != Some(id)
        || !constant_time_eq(expected.as_bytes(), secret.as_bytes())
        || data("usage-bootstrap-authentication").as_deref() != Some("true")
    {
        return None;
    }
    if let Some(exp) = data("expiration") {
        let exp = chrono::DateTime::parse_from_rfc3339(&exp).ok()?;
        if exp < chrono::Utc::now() {
            tracing::info!(token_id = id, "refused expired bootstrap token");
            return None;
        }
    }
    let mut groups = vec!["system:bootstrappers".to_string()];
    if let Some(extra) = data("auth-extra-groups") {
        groups.extend(
            extra
                .split(',')
                .map(str::trim)
                .filter(|g| g.starts_with("system:bootstrappers:"))
                .map(str::to_string),
        );
    }
    Some(UserInfo {
        name: format!("system:bootstrap:{id}"),
        groups,
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

// ServiceAccount tokens are JWTs signed with HS256. Only this server issues and verifies
// them, so a shared-secret MAC over `hmac`/`sha2` is enough and avoids a second crypto stack.
type HmacSha256 = Hmac<Sha256>;

fn sign(key: &[u8], data: &str) -> String {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data.as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// The audience this API server accepts, as kube-apiserver's default `--api-audiences`.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc";

/// The object a token is bound to (a Pod), as TokenRequest's `boundObjectRef` names it: the
/// token dies with it.
#[derive(Clone, Debug)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// Issues a token for ServiceAccount `namespace/name` (uid `uid`), valid `seconds`, bound to
/// `pod` when given.
pub fn issue_service_account_token(
    state: &State,
    namespace: &str,
    name: &str,
    uid: &str,
    audiences: &[String],
    seconds: i64,
    pod: Option<&BoundPod>,
) -> (String, chrono::DateTime<chrono::Utc>) {
    let now = chrono::Utc::now();
    let exp = now + chrono::Duration::seconds(seconds);
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let mut claims = json!({
        "iss": "https://kubernetes.default.svc",
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "aud": audiences,
        "iat": now.timestamp(),
        "nbf": now.timestamp(),
        "exp": exp.timestamp(),
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}},
    });
    if let Some(pod) = pod {
        claims["kubernetes.io"]["pod"] = json!({"name": pod.name, "uid": pod.uid});
    }
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{payload}");
    let signature = sign(&state.pki.token_key, &signing_input);
    (format!("{signing_input}.{signature}"), exp)
}

fn service_account_token(state: &State, token: &str) -> Option<UserInfo> {
    let (signing_input, signature) = token.rsplit_once('.')?;
    if !constant_time_eq(
        sign(&state.pki.token_key, signing_input).as_bytes(),
        signature.as_bytes(),
    ) {
        return None;
    }
    let payload = signing_input.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    if claims["exp"].as_i64()? < chrono::Utc::now().timestamp() {
        return None;
    }
    // A token meant for another audience (a Vault, a webhook) is not a credential here, as
    // kube-apiserver checks `aud` against its --api-audiences.
    let audiences = match &claims["aud"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences.contains(&API_AUDIENCE) {
        return None;
    }
    let k = &claims["kubernetes.io"];
    let namespace = k["namespace"].as_str()?;
    let name = k["serviceaccount"]["name"].as_str()?;
    // A token dies with its ServiceAccount: a recreated account has another uid.
    let sa = state.store.get("/serviceaccounts", namespace, name)?;
    if *sa.uid != *k["serviceaccount"]["uid"].as_str()? {
        return None;
    }
    // A bound token dies with its pod (kube-apiserver checks the pod's uid the same way).
    if let Some(pod) = k.get("pod") {
        let live = state.store.get("/pods", namespace, pod["name"].as_str()?)?;
        if *live.uid != *pod["uid"].as_str()? {
            return None;
        }
        // A deleted pod's token lasts as long as kube-apiserver lets it: 60 s past the pod's
        // deletionTimestamp (the end of its grace period).
        let deleted = live.value()["metadata"]["deletionTimestamp"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if deleted.is_some_and(|t| t + chrono::Duration::seconds(60) < chrono::Utc::now()) {
            return None;
        }
    }
    Some(UserInfo {
        name: format!("system:serviceaccount:{namespace}:{name}"),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
        ],
    })
}
