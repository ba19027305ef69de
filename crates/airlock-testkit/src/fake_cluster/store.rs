//! The fake API server's objects other than Pods: the kinds `airlock kube install` applies
//! and `airlock doctor` reads, kept as JSON; server-side apply with field ownership; and
//! RBAC over the stored Roles and bindings.
//!
//! A model of the real thing, not a copy: ownership is tracked per leaf field (maps merge
//! key by key; lists are atomic, as the lists of these kinds are in the real schema), a
//! manager's field it stops applying is removed unless another manager owns it too, a
//! changed field owned by another manager is a conflict unless `force`, an apply that
//! changes nothing writes nothing (the resource version stays). Not modelled: schema
//! validation and defaulting, `fieldsV1` (managedFields name the managers only), YAML
//! bodies (JSON, the subset of YAML kube-rs sends, only), aggregated ClusterRoles, and
//! `resourceNames` matched through a field selector on list and watch.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// One kind the fake API server stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version, e.g. `v1`.
    pub version: &'static str,
    /// The plural of its URL paths, e.g. `networkpolicies`.
    pub plural: &'static str,
    /// Its `kind`, e.g. `NetworkPolicy`.
    pub kind: &'static str,
    /// Whether its objects live in a namespace.
    pub namespaced: bool,
}

impl Kind {
    /// Its objects' `apiVersion`: `group/version`, or the version alone in the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn kind(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Kind {
    Kind {
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
    }
}

/// Every kind stored here (Pods have a store of their own, `apiserver.rs`).
pub const KINDS: &[Kind] = &[
    kind("", "namespaces", "Namespace", false),
    kind("", "serviceaccounts", "ServiceAccount", true),
    kind("", "resourcequotas", "ResourceQuota", true),
    kind("", "limitranges", "LimitRange", true),
    kind(
        "networking.k8s.io",
        "networkpolicies",
        "NetworkPolicy",
        true,
    ),
    kind("rbac.authorization.k8s.io", "roles", "Role", true),
    kind(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "RoleBinding",
        true,
    ),
    kind(
        "rbac.authorization.k8s.io",
        "clusterroles",
        "ClusterRole",
        false,
    ),
    kind(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
    ),
    kind("node.k8s.io", "runtimeclasses", "RuntimeClass", false),
];

/// The stored kind of a URL's group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<Kind> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
        .copied()
}

/// Where an object is: its kind's plural, its namespace (empty when cluster-scoped), its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// The kind's plural.
    pub plural: String,
    /// The namespace; empty for a cluster-scoped object.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl Key {
    /// The key of the object `name` of the kind `plural` in `namespace`.
    pub fn new(plural: &str, namespace: &str, name: &str) -> Self {
        Self {
            plural: plural.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// A field's path in an object: its keys from the root.
pub type Path = Vec<String>;

/// A stored object and who owns which of its fields.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// The object, as JSON.
    pub object: Value,
    /// Leaf field → the managers owning it.
    pub owners: BTreeMap<Path, BTreeSet<String>>,
    /// Manager → its last operation (`Apply` or `Update`).
    pub managers: BTreeMap<String, &'static str>,
}

impl Stored {
    /// The managers of the object, as the server's `metadata.managedFields` (no fieldsV1).
    pub fn managed_fields(&self, api_version: &str) -> Value {
        let owning: BTreeSet<&String> = self.owners.values().flatten().collect();
        Value::Array(
            self.managers
                .iter()
                .filter(|(m, _)| owning.contains(m))
                .map(|(m, op)| json!({"manager": m, "operation": op, "apiVersion": api_version}))
                .collect(),
        )
    }
}

/// The fields a manager can own in `object`: everything but the identity (`apiVersion`,
/// `kind`, `metadata.name`, `metadata.namespace`), the rest of `metadata` except labels and
/// annotations, and `status`. Maps are walked; lists, scalars and empty maps are leaves.
pub fn leaves(object: &Value) -> BTreeMap<Path, Value> {
    fn walk(value: &Value, path: Path, out: &mut BTreeMap<Path, Value>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    let mut p = path.clone();
                    p.push(k.clone());
                    walk(v, p, out);
                }
            }
            _ => {
                out.insert(path, value.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    let Some(map) = object.as_object() else {
        return out;
    };
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                for field in ["labels", "annotations"] {
                    if let Some(m) = v.get(field) {
                        walk(m, vec!["metadata".to_owned(), field.to_owned()], &mut out);
                    }
                }
            }
            _ => walk(v, vec![k.clone()], &mut out),
        }
    }
    out
}

/// The value at `path` in `value`, when there is one.
pub fn get<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, k| v.get(k))
}

fn set(value: &mut Value, path: &[String], leaf: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = value;
    for k in parents {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        at = at
            .as_object_mut()
            .unwrap()
            .entry(k.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    at.as_object_mut().unwrap().insert(last.clone(), leaf);
}

/// Removes the field at `path`, and the maps it leaves empty (not `metadata`).
fn remove(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = &mut *value;
    for k in parents {
        match at.get_mut(k) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(map) = at.as_object_mut() {
        map.remove(last);
    }
    if parents.len() > 1
        && get(value, parents)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
    {
        remove(value, parents);
    }
}

/// Server-side apply of `config` by `manager` onto `stored` (`None`: a new object); the
/// conflicts, as the real server words them, when another manager owns a field `config`
/// changes and `force` is not set.
pub fn apply(
    stored: Option<&Stored>,
    manager: &str,
    config: &Value,
    force: bool,
) -> Result<Stored, Vec<String>> {
    let mut next = stored.cloned().unwrap_or_else(|| Stored {
        object: json!({}),
        ..Default::default()
    });
    let wanted = leaves(config);
    let conflicts: Vec<String> = wanted
        .iter()
        .filter(|(path, value)| get(&next.object, path) != Some(*value))
        .filter_map(|(path, _)| {
            let other = next.owners.get(path)?.iter().find(|m| *m != manager)?;
            Some(format!("conflict with {other:?}: .{}", path.join(".")))
        })
        .collect();
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    // Fields this manager applied before and no longer does: released, and removed when
    // nobody else owns them.
    let released: Vec<Path> = next
        .owners
        .iter()
        .filter(|(path, owners)| owners.contains(manager) && !wanted.contains_key(*path))
        .map(|(path, _)| path.clone())
        .collect();
    for path in released {
        let owners = next.owners.entry(path.clone()).or_default();
        owners.remove(manager);
        if owners.is_empty() {
            next.owners.remove(&path);
            remove(&mut next.object, &path);
        }
    }
    for (path, value) in wanted {
        let owners = next.owners.entry(path.clone()).or_default();
        if get(&next.object, &path) != Some(&value) {
            // Changed (forced, or nobody else owned it): this manager's alone now.
            owners.clear();
            set(&mut next.object, &path, value);
        }
        owners.insert(manager.to_owned());
    }
    next.managers.insert(manager.to_owned(), "Apply");
    Ok(next)
}

/// A write that is not an apply (create, update) by `manager`: it owns every field it set
/// or changed; fields it removed are nobody's.
pub fn update(stored: Option<&Stored>, manager: &str, object: Value) -> Stored {
    let mut next = stored.cloned().unwrap_or_default();
    let before = leaves(&next.object);
    let after = leaves(&object);
    next.owners.retain(|path, _| after.contains_key(path));
    for (path, value) in &after {
        if before.get(path) != Some(value) || !next.owners.contains_key(path) {
            next.owners
                .insert(path.clone(), BTreeSet::from([manager.to_owned()]));
        }
    }
    next.object = object;
    next.managers.insert(manager.to_owned(), "Update");
    next
}

/// Who a request comes from (a bearer token the server knows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user's name, as RBAC subjects name it.
    pub name: String,
    /// Its groups, as RBAC subjects name them.
    pub groups: Vec<String>,
}

/// What a request asks to do, as RBAC sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `create`, `patch`, ….
    pub verb: String,
    /// The API group; empty for the core group.
    pub group: String,
    /// The resource's plural, e.g. `pods`.
    pub resource: String,
    /// The subresource, e.g. `log`; empty for none.
    pub subresource: String,
    /// The namespace; empty for a cluster-scoped request.
    pub namespace: String,
    /// The object's name; empty for a list or a create.
    pub name: String,
}

impl Attributes {
    /// The real server's words for a denial.
    pub fn forbidden(&self, user: &User) -> String {
        let what = if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        let object = if self.name.is_empty() {
            what.clone()
        } else {
            format!("{what} {:?}", self.name)
        };
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace {:?}", self.namespace)
        };
        format!(
            "{object} is forbidden: User {:?} cannot {} resource {what:?} in API group {:?} {scope}",
            user.name, self.verb, self.group
        )
    }
}

fn lists(value: &Value, field: &str, want: &str) -> bool {
    value
        .get(field)
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|v| v == want || v == "*"))
}

fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let names = rule
        .get("resourceNames")
        .and_then(Value::as_array)
        .filter(|n| !n.is_empty());
    lists(rule, "verbs", &a.verb)
        && lists(rule, "apiGroups", &a.group)
        && lists(rule, "resources", &resource)
        && names.is_none_or(|n| !a.name.is_empty() && n.iter().any(|v| v == &a.name))
}

fn subject_is(subject: &Value, user: &User) -> bool {
    let field = |f: &str| subject.get(f).and_then(Value::as_str).unwrap_or("");
    match field("kind") {
        "User" => field("name") == user.name,
        "Group" => user.groups.iter().any(|g| g == field("name")),
        "ServiceAccount" => {
            user.name
                == format!(
                    "system:serviceaccount:{}:{}",
                    field("namespace"),
                    field("name")
                )
        }
        _ => false,
    }
}

/// Whether the stored Roles, ClusterRoles and their bindings let `user` do `a`.
pub fn allowed(objects: &BTreeMap<Key, Stored>, user: &User, a: &Attributes) -> bool {
    let rules = |role: &Value, binding_namespace: &str| -> Vec<Value> {
        let name = role.get("name").and_then(Value::as_str).unwrap_or("");
        let key = match role.get("kind").and_then(Value::as_str) {
            Some("ClusterRole") => Key::new("clusterroles", "", name),
            Some("Role") => Key::new("roles", binding_namespace, name),
            _ => return Vec::new(),
        };
        objects
            .get(&key)
            .and_then(|r| r.object.get("rules"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    objects
        .iter()
        .filter(|(key, _)| {
            key.plural == "clusterrolebindings"
                || (key.plural == "rolebindings"
                    && !a.namespace.is_empty()
                    && key.namespace == a.namespace)
        })
        .filter(|(_, binding)| {
            binding
                .object
                .get("subjects")
                .and_then(Value::as_array)
                .is_some_and(|s| s.iter().any(|s| subject_is(s, user)))
        })
        .flat_map(|(key, binding)| {
            binding
                .object
                .get("roleRef")
                .map(|r| rules(r, &key.namespace))
                .unwrap_or_default()
        })
        .any(|rule| rule_allows(&rule, a))
}

/// Whether `labels` match a label selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-joined).
pub fn selector_matches(
    selector: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<bool, String> {
    let mut all = true;
    for requirement in selector.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let get = |k: &str| labels.and_then(|l| l.get(k.trim()));
        let ok = if let Some((k, v)) = requirement.split_once("!=") {
            get(k).is_none_or(|x| x != v.trim())
        } else if let Some((k, v)) = requirement
            .split_once("==")
            .or_else(|| requirement.split_once('='))
        {
            get(k).is_some_and(|x| x == v.trim())
        } else if let Some(k) = requirement.strip_prefix('!') {
            get(k).is_none()
        } else if requirement.contains(' ') || requirement.contains('(') {
            return Err(format!(
                "the fake API server cannot parse the requirement {requirement:?}"
            ));
        } else {
            get(requirement).is_some()
        };
        all &= ok;
    }
    Ok(all)
}
