//! What an answer of the Kubernetes API means, for every crate that talks to a cluster (the
//! Go client's `apierrors.IsNotFound`): kube's `Status` knows the reasons; these read them off
//! a `kube::Error` and give deletes the handling Tandem wants everywhere. Reads that may find
//! nothing use kube's `Api::get_opt`.

use kube::Api;
use kube::api::DeleteParams;
use kube::core::Status;

fn status(e: &kube::Error) -> Option<&Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

/// The HTTP status the API server answered with; `None` when it did not answer at all.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    status(e).map(|s| s.code)
}

/// The object does not exist (404 NotFound).
pub fn is_not_found(e: &kube::Error) -> bool {
    status(e).is_some_and(Status::is_not_found)
}

/// The write lost a race: a stale resourceVersion, or a create of a name that exists (409).
pub fn is_conflict(e: &kube::Error) -> bool {
    status(e).is_some_and(|s| s.is_conflict() || s.is_already_exists())
}

/// The object is gone or no longer ours to touch: 404, or 401/403 once a peer revoked our access.
pub fn is_gone_or_forbidden(e: &kube::Error) -> bool {
    is_not_found(e) || matches!(status_code(e), Some(401 | 403))
}

/// `result`, with a 404 answer as `Ok(None)`.
pub fn ok_if_not_found<T>(result: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes `name`; an object already gone is success.
pub async fn delete_if_exists<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ok_if_not_found(api.delete(name, params).await).map(|_| ())
}

/// The certificate a CSR was issued, once its signer has written one (`status.certificate`
/// present and not empty, as kubectl's `certificate approve` waits for).
pub fn issued_certificate(
    csr: &k8s_openapi::api::certificates::v1::CertificateSigningRequest,
) -> Option<&k8s_openapi::ByteString> {
    csr.status
        .as_ref()?
        .certificate
        .as_ref()
        .filter(|c| !c.0.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            reason: reason.into(),
            ..Status::failure("", reason)
        }))
    }

    #[test]
    fn answers_table() {
        // (error, not found, conflict, gone or forbidden)
        let cases = [
            (answer(404, "NotFound"), true, false, true),
            (answer(409, "Conflict"), false, true, false),
            (answer(409, "AlreadyExists"), false, true, false),
            (answer(403, "Forbidden"), false, false, true),
            (answer(401, "Unauthorized"), false, false, true),
            (answer(500, "InternalError"), false, false, false),
            (
                kube::Error::LinesCodecMaxLineLengthExceeded,
                false,
                false,
                false,
            ),
        ];
        for (e, not_found, conflict, gone) in cases {
            assert_eq!(is_not_found(&e), not_found, "{e}");
            assert_eq!(is_conflict(&e), conflict, "{e}");
            assert_eq!(is_gone_or_forbidden(&e), gone, "{e}");
        }
        assert_eq!(status_code(&answer(422, "Invalid")), Some(422));
        assert_eq!(
            status_code(&kube::Error::LinesCodecMaxLineLengthExceeded),
            None
        );
    }
}
