//! The reach of the public enrollment credential: which RBAC bindings give it more than filing
//! peering requests. A bootstrap token authenticates with groups `system:bootstrappers` and
//! `system:authenticated` (and the extra groups its Secret names, Tandem's enroll group), so
//! whatever an administrator binds to any of them, the published token gets too.

/// The groups every bootstrap token is in, whatever its Secret says.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// The group every authenticated request is in.
pub const AUTHENTICATED: &str = "system:authenticated";

/// The bindings Kubernetes itself makes to `system:authenticated` (kube-apiserver's bootstrap
/// policy, `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`): discovery, self-review and
/// `/version`, `/healthz` — each a ClusterRoleBinding named as the ClusterRole it binds.
pub const KUBE_DEFAULT_BINDINGS: [&str; 3] = [
    "system:basic-user",
    "system:discovery",
    "system:public-info-viewer",
];

/// One RoleBinding or ClusterRoleBinding, as far as the judgement needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    /// The binding's namespace; None for a ClusterRoleBinding.
    pub namespace: Option<String>,
    pub name: String,
    /// `Role` or `ClusterRole`.
    pub role_kind: String,
    pub role_name: String,
    /// `(kind, name)` of each subject: `Group`, `User`, `ServiceAccount`.
    pub subjects: Vec<(String, String)>,
}

impl Binding {
    fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!(
                "RoleBinding {ns}/{} ({} {})",
                self.name, self.role_kind, self.role_name
            ),
            None => format!(
                "ClusterRoleBinding {} ({} {})",
                self.name, self.role_kind, self.role_name
            ),
        }
    }
}

/// What the credential is: the user its token authenticates as (`system:bootstrap:<id>`), the
/// extra group its Secret gives it, and Tandem's own binding of that group (the one thing it
/// is meant to reach: filing requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential<'a> {
    pub user: &'a str,
    pub enroll_group: &'a str,
    /// `(namespace, name, Role name)` of Tandem's RoleBinding of the enroll group.
    pub own_binding: (&'a str, &'a str, &'a str),
}

/// The bindings that give the credential more than filing requests, each described with the
/// subject that lets it in (`ClusterRoleBinding wide-open (ClusterRole view) binds group
/// system:authenticated`), in the order given. Kubernetes' own bindings to
/// `system:authenticated` are left out only while they bind what their names say (a binding
/// recreated under such a name with another role is named like any other), and so is Tandem's
/// RoleBinding of the enroll group to its own Role.
pub fn reach_beyond_filing(bindings: &[Binding], credential: &Credential) -> Vec<String> {
    let mut found = Vec::new();
    for b in bindings {
        let kube_default = b.namespace.is_none()
            && KUBE_DEFAULT_BINDINGS.contains(&b.name.as_str())
            && b.role_kind == "ClusterRole"
            && b.role_name == b.name;
        let (own_ns, own_name, own_role) = credential.own_binding;
        let own = b.namespace.as_deref() == Some(own_ns)
            && b.name == own_name
            && b.role_kind == "Role"
            && b.role_name == own_role;
        let reaching: Vec<String> = b
            .subjects
            .iter()
            .filter(|(kind, name)| match kind.as_str() {
                "Group" if name == AUTHENTICATED => !kube_default,
                "Group" if name == BOOTSTRAPPERS => true,
                "Group" if name == credential.enroll_group => !own,
                "User" => name == credential.user,
                _ => false,
            })
            .map(|(kind, name)| format!("{} {name}", kind.to_ascii_lowercase()))
            .collect();
        if !reaching.is_empty() {
            found.push(format!("{} binds {}", b.describe(), reaching.join(", ")));
        }
    }
    found
}

/// What the controller makes of the credential's reach while it is advertised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the token may authenticate (its Secret's `usage-bootstrap-authentication`).
    pub enabled: bool,
    /// The condition's reason.
    pub reason: &'static str,
    pub message: String,
}

/// The credential works only while nothing reaches beyond filing requests (`reach`, from
/// [`reach_beyond_filing`]); otherwise it is withdrawn, the message naming every binding, and
/// comes back once they are gone.
pub fn verdict(reach: &[String]) -> Verdict {
    if reach.is_empty() {
        return Verdict {
            enabled: true,
            reason: "FilesRequestsOnly",
            message: "the enrollment credential can do nothing but file peering requests".into(),
        };
    }
    Verdict {
        enabled: false,
        reason: "ReachesBeyondFiling",
        message: format!(
            "enrollment withdrawn (the published credential no longer authenticates) because a bootstrap token would get more than filing peering requests: {}; it resumes by itself once that is gone",
            reach.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIAL: Credential = Credential {
        user: "system:bootstrap:abcdef",
        enroll_group: "system:bootstrappers:tandem:enroll",
        own_binding: ("tandem-enroll", "tandem:enroll", "tandem:enroll"),
    };

    fn cluster(name: &str, role: &str, subjects: &[(&str, &str)]) -> Binding {
        Binding {
            namespace: None,
            name: name.into(),
            role_kind: "ClusterRole".into(),
            role_name: role.into(),
            subjects: subjects
                .iter()
                .map(|(k, n)| (k.to_string(), n.to_string()))
                .collect(),
        }
    }

    fn namespaced(
        ns: &str,
        name: &str,
        kind: &str,
        role: &str,
        subjects: &[(&str, &str)],
    ) -> Binding {
        Binding {
            namespace: Some(ns.into()),
            role_kind: kind.into(),
            ..cluster(name, role, subjects)
        }
    }

    #[test]
    fn only_bindings_beyond_filing_requests_are_named() {
        let cases: Vec<(&str, Binding, Option<&str>)> = vec![
            (
                "kube's discovery binding",
                cluster(
                    "system:discovery",
                    "system:discovery",
                    &[("Group", AUTHENTICATED)],
                ),
                None,
            ),
            (
                "kube's basic-user binding",
                cluster(
                    "system:basic-user",
                    "system:basic-user",
                    &[("Group", AUTHENTICATED)],
                ),
                None,
            ),
            (
                "kube's public-info binding, anonymous callers too",
                cluster(
                    "system:public-info-viewer",
                    "system:public-info-viewer",
                    &[
                        ("Group", AUTHENTICATED),
                        ("Group", "system:unauthenticated"),
                    ],
                ),
                None,
            ),
            (
                "a kube default name rebound to another role",
                cluster(
                    "system:discovery",
                    "cluster-admin",
                    &[("Group", AUTHENTICATED)],
                ),
                Some(
                    "ClusterRoleBinding system:discovery (ClusterRole cluster-admin) binds group system:authenticated",
                ),
            ),
            (
                "an admin's grant to every authenticated user",
                cluster("everyone-views", "view", &[("Group", AUTHENTICATED)]),
                Some(
                    "ClusterRoleBinding everyone-views (ClusterRole view) binds group system:authenticated",
                ),
            ),
            (
                "kubelet TLS bootstrapping bound to every bootstrap token",
                cluster(
                    "kubelet-bootstrap",
                    "system:node-bootstrapper",
                    &[("Group", BOOTSTRAPPERS)],
                ),
                Some(
                    "ClusterRoleBinding kubelet-bootstrap (ClusterRole system:node-bootstrapper) binds group system:bootstrappers",
                ),
            ),
            (
                "kubeadm's narrower node-token group",
                cluster(
                    "kubeadm:kubelet-bootstrap",
                    "system:node-bootstrapper",
                    &[("Group", "system:bootstrappers:kubeadm:default-node-token")],
                ),
                None,
            ),
            (
                "a namespaced grant to authenticated users",
                namespaced(
                    "apps",
                    "all-edit",
                    "ClusterRole",
                    "edit",
                    &[("User", "alice"), ("Group", AUTHENTICATED)],
                ),
                Some(
                    "RoleBinding apps/all-edit (ClusterRole edit) binds group system:authenticated",
                ),
            ),
            (
                "Tandem's own enroll binding",
                namespaced(
                    "tandem-enroll",
                    "tandem:enroll",
                    "Role",
                    "tandem:enroll",
                    &[("Group", CREDENTIAL.enroll_group)],
                ),
                None,
            ),
            (
                "the enroll group bound anywhere else",
                namespaced(
                    "default",
                    "tandem:enroll",
                    "ClusterRole",
                    "admin",
                    &[("Group", CREDENTIAL.enroll_group)],
                ),
                Some(
                    "RoleBinding default/tandem:enroll (ClusterRole admin) binds group system:bootstrappers:tandem:enroll",
                ),
            ),
            (
                "the token's own user",
                cluster("token-admin", "cluster-admin", &[("User", CREDENTIAL.user)]),
                Some(
                    "ClusterRoleBinding token-admin (ClusterRole cluster-admin) binds user system:bootstrap:abcdef",
                ),
            ),
            (
                "another token's user, a ServiceAccount, anonymous callers",
                cluster(
                    "others",
                    "view",
                    &[
                        ("User", "system:bootstrap:zzzzzz"),
                        ("ServiceAccount", AUTHENTICATED),
                        ("Group", "system:unauthenticated"),
                    ],
                ),
                None,
            ),
        ];
        for (what, binding, want) in cases {
            let got = reach_beyond_filing(std::slice::from_ref(&binding), &CREDENTIAL);
            assert_eq!(
                got,
                want.into_iter().map(String::from).collect::<Vec<_>>(),
                "{what}"
            );
        }
    }

    #[test]
    fn the_credential_is_withdrawn_while_anything_reaches_further() {
        let open = verdict(&[]);
        assert!(open.enabled);
        let reach = [
            "ClusterRoleBinding everyone-views (ClusterRole view) binds group system:authenticated"
                .to_string(),
        ];
        let shut = verdict(&reach);
        assert!(!shut.enabled);
        assert_eq!(shut.reason, "ReachesBeyondFiling");
        assert!(shut.message.contains(&reach[0]), "{}", shut.message);
    }

    #[test]
    fn every_reaching_subject_of_a_binding_is_named() {
        let b = cluster(
            "both",
            "view",
            &[("Group", BOOTSTRAPPERS), ("Group", AUTHENTICATED)],
        );
        assert_eq!(
            reach_beyond_filing(&[b], &CREDENTIAL),
            [
                "ClusterRoleBinding both (ClusterRole view) binds group system:bootstrappers, group system:authenticated"
            ]
        );
    }
}
