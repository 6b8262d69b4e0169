//! The MutatingWebhookConfiguration and its serving certificate as an administrator sees them
//! (`kubectl get mutatingwebhookconfiguration tandem-pod-placement -o yaml`): where it sends
//! the API server, when the certificate is replaced and what the annotations say of it.

use super::*;

// ---- The configuration ----

#[test]
fn configuration_table() {
    let ca = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
    let bundle = STANDARD.encode(ca);
    let cases = [
        (
            "an in-process controller: called by URL",
            WebhookTarget::Url("https://127.0.0.1:9443".into()),
            json!({"url": "https://127.0.0.1:9443/mutate-pods", "caBundle": bundle}),
            json!({"url": "https://127.0.0.1:9443/mutate-pods-local", "caBundle": bundle}),
        ),
        (
            "an installed controller: called through its Service, port 443",
            WebhookTarget::Service("tandem-system".into(), "tandem-webhook".into()),
            json!({"service": {"namespace": "tandem-system", "name": "tandem-webhook",
                "path": "/mutate-pods", "port": 443}, "caBundle": bundle}),
            json!({"service": {"namespace": "tandem-system", "name": "tandem-webhook",
                "path": "/mutate-pods-local", "port": 443}, "caBundle": bundle}),
        ),
    ];
    let annotations = json!({NOT_AFTER_ANNOTATION: "2030-01-01T00:00:00Z"});
    for (case, target, placement_client, locality_client) in cases {
        let config = serde_json::to_value(configuration(&target, ca, &annotations)).unwrap();
        assert_eq!(config["metadata"]["name"], WEBHOOK_CONFIGURATION, "{case}");
        assert_eq!(config["metadata"]["annotations"], annotations, "{case}");
        assert_eq!(
            config["metadata"]["labels"][names::MANAGED_BY_LABEL],
            names::MANAGED_BY,
            "{case}"
        );
        let hooks = &config["webhooks"];
        assert_eq!(hooks[0]["name"], "pod-placement.tandem.dev", "{case}");
        assert_eq!(hooks[0]["clientConfig"], placement_client, "{case}");
        assert_eq!(hooks[0]["failurePolicy"], "Fail", "{case}");
        assert_eq!(
            hooks[0]["namespaceSelector"],
            json!({"matchLabels": {OFFLOADING_LABEL: OFFLOADING_ENABLED}}),
            "{case}"
        );
        assert_eq!(hooks[1]["name"], "pod-locality.tandem.dev", "{case}");
        assert_eq!(hooks[1]["clientConfig"], locality_client, "{case}");
        // Never blocks pod creation in the rest of the cluster.
        assert_eq!(hooks[1]["failurePolicy"], "Ignore", "{case}");
        assert_eq!(
            hooks[1]["namespaceSelector"]["matchExpressions"][1],
            json!({"key": names::TWIN_NAMESPACE_LABEL, "operator": "DoesNotExist"}),
            "{case}"
        );
        for hook in hooks.as_array().unwrap() {
            assert_eq!(
                hook["rules"],
                json!([
                    {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
                    {"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["daemonsets"]}
                ]),
                "{case}"
            );
        }
    }
}

#[test]
fn certificate_names_table() {
    let cases = [
        (
            "by URL: the loopback names",
            WebhookTarget::Url("https://127.0.0.1:9443".into()),
            vec!["127.0.0.1", "localhost"],
        ),
        (
            "through a Service: its cluster DNS names too",
            WebhookTarget::Service("tandem-system".into(), "tandem-webhook".into()),
            vec![
                "127.0.0.1",
                "localhost",
                "tandem-webhook.tandem-system.svc",
                "tandem-webhook.tandem-system.svc.cluster.local",
            ],
        ),
    ];
    for (case, target, want) in cases {
        assert_eq!(target.names(), want, "{case}");
    }
}

// ---- The serving certificate ----

/// `seconds` from 2025-06-01T12:00:00Z.
fn at(seconds: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(1_748_779_200 + seconds).unwrap()
}

#[test]
fn validity_table() {
    let now = at(0);
    let cases = [
        (
            "an hour, valid from five minutes ago",
            secs(3600),
            at(-300),
            at(3600),
        ),
        (
            "twenty years, cut to MAX_LIFETIME",
            secs(20 * 365 * 24 * 3600),
            at(-300),
            now + MAX_LIFETIME,
        ),
    ];
    for (case, lifetime, not_before, not_after) in cases {
        assert_eq!(validity(now, lifetime), (not_before, not_after), "{case}");
    }
}

#[test]
fn certificate_annotations_table() {
    let not_after = at(3600);
    let cases = [
        (
            "no request fulfilled: the expiry alone",
            None,
            json!({NOT_AFTER_ANNOTATION: "2025-06-01T13:00:00Z"}),
        ),
        (
            "a request fulfilled: named beside the expiry",
            Some("2025-06-01T12:30:00Z"),
            json!({NOT_AFTER_ANNOTATION: "2025-06-01T13:00:00Z",
                   ROTATED_ANNOTATION: "2025-06-01T12:30:00Z"}),
        ),
    ];
    for (case, fulfilled, want) in cases {
        assert_eq!(
            certificate_annotations(not_after, fulfilled),
            want,
            "{case}"
        );
    }
}

#[test]
fn renew_after_table() {
    let cases = [
        (
            "a year, a minute's propagation: two thirds",
            secs(365 * 24 * 3600),
            secs(60),
            secs(365 * 24 * 3600 * 2 / 3),
        ),
        (
            "24s, 5s propagation: two propagations before expiry",
            secs(24),
            secs(5),
            secs(14),
        ),
        (
            "24s, 10s propagation: never before half the lifetime",
            secs(24),
            secs(10),
            secs(12),
        ),
        (
            "propagation longer than the lifetime: half",
            secs(24),
            secs(60),
            secs(12),
        ),
    ];
    for (case, lifetime, propagation, want) in cases {
        assert_eq!(renew_after(lifetime, propagation), want, "{case}");
    }
}

/// A server's rotations serving since `start` (24s certificates, 5s propagation: due every
/// 14s), having fulfilled `fulfilled`, the rotation for `pending` having failed at `start`.
fn rotations(start: Instant, fulfilled: Option<&str>, pending: Option<&str>) -> Rotations {
    let mut r = Rotations::new(secs(24), secs(5), fulfilled.map(String::from), start);
    if let Some(request) = pending {
        r.failed(Rotation::Requested(request.into()), start);
    }
    r
}

#[test]
fn rotation_request_table() {
    let start = Instant::now();
    let cases = [
        (
            "the first request: Rotation::Requested",
            None,
            None,
            "t1",
            Ok(Rotation::Requested("t1".into())),
        ),
        (
            "a new request: Rotation::Requested",
            Some("t1"),
            None,
            "t2",
            Ok(Rotation::Requested("t2".into())),
        ),
        (
            "the request already fulfilled (at start, or seen again): Ignored::Fulfilled",
            Some("t1"),
            None,
            "t1",
            Err(Ignored::Fulfilled),
        ),
        (
            "the request whose rotation failed: Ignored::Pending, retried when due",
            Some("t1"),
            Some("t2"),
            "t2",
            Err(Ignored::Pending),
        ),
        (
            "a newer request while one is pending: Rotation::Requested at once",
            Some("t1"),
            Some("t2"),
            "t3",
            Ok(Rotation::Requested("t3".into())),
        ),
    ];
    for (case, fulfilled, pending, request, want) in cases {
        let r = rotations(start, fulfilled, pending);
        assert_eq!(r.when_requested(request.into()), want, "{case}");
    }
}

#[test]
fn rotation_when_due_table() {
    let start = Instant::now();
    let cases = [
        (
            "nothing pending: Rotation::Due, scheduled",
            None,
            Rotation::Due,
            "scheduled",
        ),
        (
            "a request pending: Rotation::Retry",
            Some("t2"),
            Rotation::Retry("t2".into()),
            "requested",
        ),
    ];
    for (case, pending, want, reason) in cases {
        let mut r = rotations(start, Some("t1"), pending);
        let got = r.when_due();
        assert_eq!(got, want, "{case}");
        assert_eq!(got.reason(), reason, "{case}");
        assert_eq!(r.pending, None, "{case}: taken");
    }
    // A fresh server's first rotation is due after renew_after.
    assert_eq!(rotations(start, None, None).due, start + secs(14));
}

#[test]
fn rotation_annotations_table() {
    let start = Instant::now();
    // (case, fulfilled, rotation, the request named while both CAs are trusted, once the new
    // certificate serves)
    let cases = [
        (
            "Due, nothing fulfilled: none named",
            None,
            Rotation::Due,
            (None, None),
        ),
        (
            "Due: the request fulfilled stays named",
            Some("t1"),
            Rotation::Due,
            (Some("t1"), Some("t1")),
        ),
        (
            "Requested: named once the new certificate serves",
            Some("t1"),
            Rotation::Requested("t2".into()),
            (Some("t1"), Some("t2")),
        ),
        (
            "Retry: as requested",
            Some("t1"),
            Rotation::Retry("t2".into()),
            (Some("t1"), Some("t2")),
        ),
    ];
    for (case, fulfilled, rotation, (before, after)) in cases {
        let r = rotations(start, fulfilled, None);
        assert_eq!(
            r.annotated(&rotation),
            Fulfilled { before, after },
            "{case}"
        );
    }
}

#[test]
fn rotation_outcome_table() {
    let start = Instant::now();
    let at = start + secs(100);
    // (case, pending before, rotation, succeeded, fulfilled after, pending after, next due)
    let cases = [
        (
            "Due succeeded: next due after renew_after",
            None,
            Rotation::Due,
            true,
            Some("t1"),
            None,
            at + secs(14),
        ),
        (
            "Requested succeeded: fulfilled",
            None,
            Rotation::Requested("t2".into()),
            true,
            Some("t2"),
            None,
            at + secs(14),
        ),
        (
            "Requested succeeded while another was pending: that one is dropped",
            Some("t2"),
            Rotation::Requested("t3".into()),
            true,
            Some("t3"),
            None,
            at + secs(14),
        ),
        (
            "Retry succeeded: fulfilled",
            None,
            Rotation::Retry("t2".into()),
            true,
            Some("t2"),
            None,
            at + secs(14),
        ),
        (
            "Due failed: tried again in 30s",
            None,
            Rotation::Due,
            false,
            Some("t1"),
            None,
            at + ROTATION_RETRY,
        ),
        (
            "Requested failed: pending, tried again in 30s",
            None,
            Rotation::Requested("t2".into()),
            false,
            Some("t1"),
            Some("t2"),
            at + ROTATION_RETRY,
        ),
        (
            "Requested failed while another was pending: the newer pending",
            Some("t2"),
            Rotation::Requested("t3".into()),
            false,
            Some("t1"),
            Some("t3"),
            at + ROTATION_RETRY,
        ),
        (
            "Retry failed: pending again",
            None,
            Rotation::Retry("t2".into()),
            false,
            Some("t1"),
            Some("t2"),
            at + ROTATION_RETRY,
        ),
    ];
    assert_eq!(ROTATION_RETRY, secs(30));
    for (case, pending, rotation, succeeded, fulfilled, pending_after, due) in cases {
        let mut r = rotations(start, Some("t1"), pending);
        if succeeded {
            r.rotated(rotation, at);
        } else {
            r.failed(rotation, at);
        }
        assert_eq!(r.fulfilled.as_deref(), fulfilled, "{case}");
        assert_eq!(r.pending.as_deref(), pending_after, "{case}");
        assert_eq!(r.due, due, "{case}");
    }
}

#[test]
fn a_failed_request_is_retried_then_fulfilled_once() {
    let start = Instant::now();
    let mut r = rotations(start, None, None);
    // `tandem rotate webhook-certificate` writes t1; the rotation fails.
    let first = r.when_requested("t1".into()).unwrap();
    r.failed(first, start + secs(1));
    assert_eq!(r.due, start + secs(31));
    // The watch sees t1 again meanwhile: no second rotation.
    assert_eq!(r.when_requested("t1".into()), Err(Ignored::Pending));
    // Due: retried, and it succeeds.
    let retry = r.when_due();
    assert_eq!(retry, Rotation::Retry("t1".into()));
    assert_eq!(
        r.annotated(&retry),
        Fulfilled {
            before: None,
            after: Some("t1")
        }
    );
    r.rotated(retry, start + secs(40));
    assert_eq!(r.due, start + secs(54));
    // Seen again after: fulfilled.
    assert_eq!(r.when_requested("t1".into()), Err(Ignored::Fulfilled));
    // The next scheduled rotation keeps naming it.
    let due = r.when_due();
    assert_eq!(
        r.annotated(&due),
        Fulfilled {
            before: Some("t1"),
            after: Some("t1")
        }
    );
}
