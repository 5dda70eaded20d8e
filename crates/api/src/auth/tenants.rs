//! Tenants as principals: the tenants the operator made, the keys issued to each (kept only as
//! SHA-256 digests: a key is shown once, when issued), what a key may do (read only, a set of
//! lambdas, an expiry), and which tenant owns each lambda name. One JSON file, `DIR/tenants.json`
//! (mode 0600), rewritten whole through a temporary file and a rename at every change, so a
//! crash leaves the old file or the new one, never half of one.
//!
//! A key reads `spk_<id>_<secret>`: 16 hex digits naming the key (kept in the clear, shown in
//! listings and the logs) and 64 of secret (32 random bytes). A key is looked up by its id
//! and its secret's digest compared in constant time.
//!
//! Lambda names stay global (OpenLambda's `/run/<name>` unchanged): the first tenant to
//! upload a name owns it; another tenant's upload of it answers 409 `name_taken` (the one
//! thing a tenant learns of another's names, as with S3's bucket names), and every other
//! route answers 404 for a lambda the key may not see. A lambda nobody owns is the operator's.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::token::{same_token, Token};
use crate::quotas::Quotas;

/// The store's file in a worker directory.
pub const TENANTS_FILE: &str = "tenants.json";
const KEY_PREFIX: &str = "spk_";
const ID_DIGITS: usize = 16;
const SECRET_DIGITS: usize = 64;

/// What a key may do, given when it is issued.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// GET and HEAD only.
    #[serde(default)]
    pub read_only: bool,
    /// Only these of the tenant's lambdas (None: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambdas: Option<BTreeSet<String>>,
    /// Refused from this time on (seconds since the epoch; None: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
}

/// A key as stored and listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub id: String,
    /// SHA-256 of the secret, hex.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    digest: String,
    pub created: u64,
    #[serde(flatten)]
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<u64>,
}

impl KeyRecord {
    /// The record as a listing shows it (no digest).
    pub fn public(&self) -> KeyRecord {
        KeyRecord { digest: String::new(), ..self.clone() }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Tenant {
    created: u64,
    #[serde(default)]
    keys: Vec<KeyRecord>,
    #[serde(default, skip_serializing_if = "is_unlimited")]
    quotas: Quotas,
    /// The isolation class (a back-end's name) its lambdas are uploaded in; None: the worker's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    isolation: Option<String>,
}

fn is_unlimited(quotas: &Quotas) -> bool {
    *quotas == Quotas::default()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    #[serde(default)]
    tenants: BTreeMap<String, Tenant>,
    /// Lambda name to its owning tenant.
    #[serde(default)]
    owners: BTreeMap<String, String>,
    /// The app port's host names (normalized) to their owning tenant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    hosts: BTreeMap<String, String>,
    /// Key id to its tenant, made again at every change (not stored).
    #[serde(skip)]
    key_index: std::collections::HashMap<String, String>,
}

/// The owned names of one kind.
#[derive(Clone, Copy)]
enum Names {
    Lambdas,
    Hosts,
}

impl Names {
    fn of(self, s: &State) -> &BTreeMap<String, String> {
        match self {
            Names::Lambdas => &s.owners,
            Names::Hosts => &s.hosts,
        }
    }

    fn of_mut(self, s: &mut State) -> &mut BTreeMap<String, String> {
        match self {
            Names::Lambdas => &mut s.owners,
            Names::Hosts => &mut s.hosts,
        }
    }
}

impl State {
    fn index_keys(mut self) -> State {
        self.key_index = self.tenants.iter().flat_map(|(name, t)| t.keys.iter().map(move |k| (k.id.clone(), name.clone()))).collect();
        self
    }
}

/// Who a tenant's key speaks for, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub tenant: String,
    pub key_id: String,
    pub scope: Scope,
}

impl Grant {
    /// Whether this key may see `lambda`, which `owner` owns (None: the operator).
    pub fn sees(&self, lambda: &str, owner: Option<&str>) -> bool {
        owner == Some(self.tenant.as_str()) && self.scope.lambdas.as_ref().is_none_or(|set| set.contains(lambda))
    }
}

/// Why a presented key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a key of this worker (or not shaped like one).
    Unknown,
    Revoked,
    Expired,
}

/// A change the store refused, each with its API error.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    InvalidName(String),
    TenantExists(String),
    TenantNotFound(String),
    /// The tenant still owns these lambdas.
    TenantNotEmpty(String, usize),
    KeyNotFound(String),
    /// Another principal has the lambda's name.
    NameTaken(String),
    /// The file could not be written: nothing changed.
    Io(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::InvalidName(n) => write!(f, "{n:?} is not a tenant name (1-64 letters, digits, '-', '_', '.')"),
            StoreError::TenantExists(n) => write!(f, "tenant {n:?} exists"),
            StoreError::TenantNotFound(n) => write!(f, "no tenant named {n:?}"),
            StoreError::TenantNotEmpty(n, count) => {
                write!(f, "tenant {n:?} still owns {count} lambda(s) or site(s): delete them first (nothing was removed)")
            }
            StoreError::KeyNotFound(id) => write!(f, "no key {id:?} of this tenant"),
            StoreError::NameTaken(n) => write!(f, "the name {n:?} is taken: lambda and host names are global; choose another"),
            StoreError::Io(e) => write!(f, "the tenant store could not be written, nothing changed: {e}"),
        }
    }
}

/// A key just issued: the only time its text exists outside the client.
#[derive(Debug)]
pub struct Issued {
    pub key: String,
    pub record: KeyRecord,
}

/// The tenants, their keys and the lambdas' owners.
pub struct Tenants {
    /// None: kept in memory only (tests, `worker.auth = false`).
    path: Option<PathBuf>,
    state: RwLock<State>,
}

fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A key's id and secret, if `text` is shaped like a key.
fn split_key(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex(id, ID_DIGITS) && hex(secret, SECRET_DIGITS)).then_some((id, secret))
}

/// Whether `text` is shaped like a tenant key (not whether it is valid).
pub fn looks_like_key(text: &str) -> bool {
    split_key(text).is_some()
}

impl Tenants {
    /// Open `DIR/tenants.json`, empty when it does not exist yet.
    pub fn open(dir: &Path) -> Result<Tenants> {
        let path = dir.join(TENANTS_FILE);
        let state = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<State>(&bytes).with_context(|| format!("reading {}", path.display()))?.index_keys(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Tenants { path: Some(path), state: RwLock::new(state) })
    }

    /// A store kept in memory only.
    pub fn in_memory() -> Tenants {
        Tenants { path: None, state: RwLock::new(State::default()) }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Apply `change` to a copy, write the copy, and only then keep it.
    fn change<T>(&self, change: impl FnOnce(&mut State) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let mut next = state.clone();
        let out = change(&mut next)?;
        let next = next.index_keys();
        if let Some(path) = &self.path {
            write_atomically(path, &next).map_err(|e| StoreError::Io(format!("{e:#}")))?;
        }
        *state = next;
        Ok(out)
    }

    /// The tenants' names, each with its count of lambdas and of live keys at `now`.
    pub fn list(&self, now: u64) -> Vec<(String, usize, usize)> {
        let state = self.read();
        state
            .tenants
            .iter()
            .map(|(name, t)| {
                let lambdas = state.owners.values().filter(|o| *o == name).count();
                let keys = t.keys.iter().filter(|k| k.revoked.is_none() && k.scope.expires.is_none_or(|e| e > now)).count();
                (name.clone(), lambdas, keys)
            })
            .collect()
    }

    pub fn exists(&self, tenant: &str) -> bool {
        self.read().tenants.contains_key(tenant)
    }

    pub fn add(&self, tenant: &str, now: u64) -> Result<(), StoreError> {
        if !sprout_engine::valid_name(tenant) {
            return Err(StoreError::InvalidName(tenant.to_string()));
        }
        self.change(|s| {
            if s.tenants.contains_key(tenant) {
                return Err(StoreError::TenantExists(tenant.to_string()));
            }
            s.tenants.insert(tenant.to_string(), Tenant { created: now, ..Tenant::default() });
            Ok(())
        })
    }

    /// Remove a tenant and its keys; refused while it owns a lambda.
    pub fn remove(&self, tenant: &str) -> Result<(), StoreError> {
        self.change(|s| {
            if !s.tenants.contains_key(tenant) {
                return Err(StoreError::TenantNotFound(tenant.to_string()));
            }
            let owned = s.owners.values().chain(s.hosts.values()).filter(|o| *o == tenant).count();
            if owned > 0 {
                return Err(StoreError::TenantNotEmpty(tenant.to_string(), owned));
            }
            s.tenants.remove(tenant);
            Ok(())
        })
    }

    /// Issue a key for `tenant`.
    pub fn issue(&self, tenant: &str, scope: Scope, now: u64) -> Result<Issued, StoreError> {
        let id = Token::generate().map_err(|e| StoreError::Io(format!("{e:#}")))?.as_str()[..ID_DIGITS].to_string();
        let secret = Token::generate().map_err(|e| StoreError::Io(format!("{e:#}")))?;
        let record = KeyRecord { id: id.clone(), digest: digest(secret.as_str()), created: now, scope, revoked: None };
        self.change(|s| {
            let t = s.tenants.get_mut(tenant).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))?;
            t.keys.push(record.clone());
            Ok(())
        })?;
        Ok(Issued { key: format!("{KEY_PREFIX}{id}_{}", secret.as_str()), record: record.public() })
    }

    /// A tenant's keys, revoked and expired ones included (no digests).
    pub fn keys(&self, tenant: &str) -> Result<Vec<KeyRecord>, StoreError> {
        let state = self.read();
        let t = state.tenants.get(tenant).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))?;
        Ok(t.keys.iter().map(KeyRecord::public).collect())
    }

    /// Revoke a key: refused from the next request on. Revoking twice keeps the first time.
    pub fn revoke(&self, tenant: &str, id: &str, now: u64) -> Result<KeyRecord, StoreError> {
        self.change(|s| {
            let t = s.tenants.get_mut(tenant).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))?;
            let key = t.keys.iter_mut().find(|k| k.id == id).ok_or_else(|| StoreError::KeyNotFound(id.to_string()))?;
            key.revoked.get_or_insert(now);
            Ok(key.public())
        })
    }

    /// Who `presented` speaks for at `now`.
    pub fn authenticate(&self, presented: &str, now: u64) -> Result<Grant, Refusal> {
        let (id, secret) = split_key(presented).ok_or(Refusal::Unknown)?;
        let wanted = digest(secret);
        let state = self.read();
        let name = state.key_index.get(id).ok_or(Refusal::Unknown)?;
        let key = state.tenants.get(name).and_then(|t| t.keys.iter().find(|k| k.id == id)).ok_or(Refusal::Unknown)?;
        if !same_token(wanted.as_bytes(), key.digest.as_bytes()) {
            return Err(Refusal::Unknown);
        }
        if key.revoked.is_some() {
            return Err(Refusal::Revoked);
        }
        if key.scope.expires.is_some_and(|e| e <= now) {
            return Err(Refusal::Expired);
        }
        Ok(Grant { tenant: name.clone(), key_id: key.id.clone(), scope: key.scope.clone() })
    }

    /// A tenant's quotas.
    pub fn quotas(&self, tenant: &str) -> Result<Quotas, StoreError> {
        self.read().tenants.get(tenant).map(|t| t.quotas.clone()).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))
    }

    /// Replace a tenant's quotas (they take effect at the next request).
    pub fn set_quotas(&self, tenant: &str, quotas: Quotas) -> Result<(), StoreError> {
        self.change(|s| {
            let t = s.tenants.get_mut(tenant).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))?;
            t.quotas = quotas;
            Ok(())
        })
    }

    /// A tenant's isolation class (None: the worker's policy).
    pub fn isolation(&self, tenant: &str) -> Result<Option<String>, StoreError> {
        self.read().tenants.get(tenant).map(|t| t.isolation.clone()).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))
    }

    /// Set a tenant's isolation class (checked by the caller against the classes the worker runs).
    pub fn set_isolation(&self, tenant: &str, class: Option<String>) -> Result<(), StoreError> {
        self.change(|s| {
            let t = s.tenants.get_mut(tenant).ok_or_else(|| StoreError::TenantNotFound(tenant.to_string()))?;
            t.isolation = class;
            Ok(())
        })
    }

    /// The tenant owning `lambda` and its quotas, when a tenant owns it (one lookup, for
    /// every invocation).
    pub fn owner_quotas(&self, lambda: &str) -> Option<(String, Quotas)> {
        let state = self.read();
        let owner = state.owners.get(lambda)?;
        Some((owner.clone(), state.tenants.get(owner).map(|t| t.quotas.clone()).unwrap_or_default()))
    }

    /// The lambdas `tenant` owns.
    pub fn owned(&self, tenant: &str) -> Vec<String> {
        self.read().owners.iter().filter(|(_, o)| *o == tenant).map(|(name, _)| name.clone()).collect()
    }

    /// The tenant owning `lambda` (None: the operator, or no such lambda).
    pub fn owner(&self, lambda: &str) -> Option<String> {
        self.read().owners.get(lambda).cloned()
    }

    /// Record `tenant` as `lambda`'s owner before its upload. `exists` says whether a lambda of
    /// that name is in the registry now. Ok(true): claimed now (release it if the upload
    /// fails); Ok(false): the tenant owned it already.
    pub fn claim(&self, lambda: &str, tenant: &str, exists: bool) -> Result<bool, StoreError> {
        self.change(|s| claim_name(&mut s.owners, &s.tenants, lambda, tenant, exists))
    }

    /// The tenant owning the app port's host `host` (normalized; None: the operator's, or none).
    pub fn host_owner(&self, host: &str) -> Option<String> {
        self.read().hosts.get(host).cloned()
    }

    /// Record `tenant` as the owner of `host` before its site is put (as [`Tenants::claim`]
    /// for lambdas: `exists` says whether a site has the host now).
    pub fn claim_host(&self, host: &str, tenant: &str, exists: bool) -> Result<bool, StoreError> {
        self.change(|s| claim_name(&mut s.hosts, &s.tenants, host, tenant, exists))
    }

    /// Forget `host`'s owner (its site removed, or its first put failed).
    pub fn release_host(&self, host: &str) -> Result<(), StoreError> {
        self.forget(host, Names::Hosts)
    }

    /// Forget `lambda`'s owner (deleted, or its first upload failed).
    pub fn release(&self, lambda: &str) -> Result<(), StoreError> {
        self.forget(lambda, Names::Lambdas)
    }

    /// Forget `name`'s owner among `names`, writing the file only when it had one.
    fn forget(&self, name: &str, names: Names) -> Result<(), StoreError> {
        if !names.of(&self.read()).contains_key(name) {
            return Ok(());
        }
        self.change(|s| {
            names.of_mut(s).remove(name);
            Ok(())
        })
    }
}

/// Record `tenant` as the owner of `name` in `owners` (lambda or host names): Ok(true) when
/// claimed now, Ok(false) when it was the tenant's already; another principal's name (or one
/// in use, `exists`, that no tenant owns: the operator's) is taken.
fn claim_name(
    owners: &mut BTreeMap<String, String>,
    tenants: &BTreeMap<String, Tenant>,
    name: &str,
    tenant: &str,
    exists: bool,
) -> Result<bool, StoreError> {
    match owners.get(name) {
        Some(owner) if owner == tenant => Ok(false),
        Some(_) => Err(StoreError::NameTaken(name.to_string())),
        None if exists => Err(StoreError::NameTaken(name.to_string())),
        None if !tenants.contains_key(tenant) => Err(StoreError::TenantNotFound(tenant.to_string())),
        None => {
            owners.insert(name.to_string(), tenant.to_string());
            Ok(true)
        }
    }
}

/// A tenant's lambdas call only their own tenant's (any other answers as missing); the
/// operator's lambdas call any.
impl sprout_engine::CallPolicy for Tenants {
    fn may_call(&self, caller: &str, callee: &str) -> bool {
        let state = self.read();
        match state.owners.get(caller) {
            None => true,
            Some(tenant) => state.owners.get(callee) == Some(tenant),
        }
    }
}

fn write_atomically(path: &Path, state: &State) -> Result<()> {
    let text = serde_json::to_vec_pretty(state)?;
    let temporary = path.with_extension("json.tmp");
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temporary)?;
    file.write_all(&text)?;
    file.sync_all()?;
    fs::rename(&temporary, path).with_context(|| format!("renaming {} to {}", temporary.display(), path.display()))?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_key_authenticates_its_tenant_until_revoked() {
        let store = Tenants::in_memory();
        store.add("acme", 1).unwrap();
        let issued = store.issue("acme", Scope::default(), 2).unwrap();
        assert!(looks_like_key(&issued.key), "{}", issued.key);
        let grant = store.authenticate(&issued.key, 3).unwrap();
        assert_eq!((grant.tenant.as_str(), grant.key_id.as_str()), ("acme", issued.record.id.as_str()));
        store.revoke("acme", &issued.record.id, 4).unwrap();
        assert_eq!(store.authenticate(&issued.key, 5), Err(Refusal::Revoked));
        // Revoking again keeps the first time.
        assert_eq!(store.revoke("acme", &issued.record.id, 9).unwrap().revoked, Some(4));
    }

    #[test]
    fn a_wrong_secret_with_a_known_id_and_junk_are_unknown() {
        let store = Tenants::in_memory();
        store.add("acme", 1).unwrap();
        let issued = store.issue("acme", Scope::default(), 2).unwrap();
        let mut wrong = issued.key.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        for junk in [wrong.as_str(), "", "spk_", "spk_x_y", &issued.key[..issued.key.len() - 1], &issued.key.to_uppercase()] {
            assert_eq!(store.authenticate(junk, 3), Err(Refusal::Unknown), "{junk:?}");
        }
    }

    #[test]
    fn an_expired_key_is_refused_from_its_expiry_on() {
        let store = Tenants::in_memory();
        store.add("acme", 1).unwrap();
        let issued = store.issue("acme", Scope { expires: Some(100), ..Scope::default() }, 2).unwrap();
        assert!(store.authenticate(&issued.key, 99).is_ok());
        assert_eq!(store.authenticate(&issued.key, 100), Err(Refusal::Expired));
        assert_eq!(store.list(100), [("acme".to_string(), 0, 0)]);
        assert_eq!(store.list(99), [("acme".to_string(), 0, 1)]);
    }

    #[test]
    fn listings_never_show_a_digest_or_a_secret() {
        let store = Tenants::in_memory();
        store.add("acme", 1).unwrap();
        let issued = store.issue("acme", Scope::default(), 2).unwrap();
        let secret = issued.key.rsplit('_').next().unwrap().to_string();
        let text = serde_json::to_string(&store.keys("acme").unwrap()).unwrap();
        assert!(!text.contains("digest") && !text.contains(&secret) && !text.contains(&digest(&secret)), "{text}");
        assert!(text.contains(&issued.record.id));
    }

    #[test]
    fn names_are_global_and_owned_by_the_first_tenant() {
        let store = Tenants::in_memory();
        store.add("a", 1).unwrap();
        store.add("b", 1).unwrap();
        assert_eq!(store.claim("echo", "a", false), Ok(true));
        assert_eq!(store.claim("echo", "a", true), Ok(false));
        assert_eq!(store.claim("echo", "b", true), Err(StoreError::NameTaken("echo".into())));
        // The operator's lambda (in the registry, owned by no tenant) is taken too.
        assert_eq!(store.claim("ops", "b", true), Err(StoreError::NameTaken("ops".into())));
        assert_eq!(store.claim("x", "nobody", false), Err(StoreError::TenantNotFound("nobody".into())));
        assert_eq!(store.owner("echo").as_deref(), Some("a"));
        assert_eq!(store.remove("a"), Err(StoreError::TenantNotEmpty("a".into(), 1)));
        store.release("echo").unwrap();
        assert_eq!(store.owner("echo"), None);
        store.remove("a").unwrap();
        assert_eq!(store.remove("a"), Err(StoreError::TenantNotFound("a".into())));
    }

    #[test]
    fn a_narrowed_key_sees_only_its_lambdas_of_its_tenant() {
        let grant = Grant {
            tenant: "a".into(),
            key_id: "k".into(),
            scope: Scope { lambdas: Some(["one".to_string()].into()), ..Scope::default() },
        };
        assert!(grant.sees("one", Some("a")));
        assert!(!grant.sees("two", Some("a")));
        assert!(!grant.sees("one", Some("b")));
        assert!(!grant.sees("one", None));
        let whole = Grant { scope: Scope::default(), ..grant };
        assert!(whole.sees("two", Some("a")) && !whole.sees("two", None));
    }

    #[test]
    fn the_store_survives_a_reopen_and_a_failed_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Tenants::open(dir.path()).unwrap();
        store.add("acme", 1).unwrap();
        let issued = store.issue("acme", Scope { read_only: true, ..Scope::default() }, 2).unwrap();
        store.claim("echo", "acme", false).unwrap();
        let again = Tenants::open(dir.path()).unwrap();
        assert!(again.authenticate(&issued.key, 3).unwrap().scope.read_only);
        assert_eq!(again.owner("echo").as_deref(), Some("acme"));
        let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(dir.path().join(TENANTS_FILE)).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        // A directory where the temporary file goes makes the write fail: nothing changes.
        fs::create_dir(dir.path().join("tenants.json.tmp")).unwrap();
        assert!(matches!(again.add("other", 4), Err(StoreError::Io(_))));
        assert!(!again.exists("other"));
        assert!(!Tenants::open(dir.path()).unwrap().exists("other"));
    }

    #[test]
    fn a_tenants_lambdas_call_only_their_own_tenants() {
        use sprout_engine::CallPolicy;
        let store = Tenants::in_memory();
        store.add("a", 1).unwrap();
        store.add("b", 1).unwrap();
        store.claim("a1", "a", false).unwrap();
        store.claim("a2", "a", false).unwrap();
        store.claim("b1", "b", false).unwrap();
        assert!(store.may_call("a1", "a2"));
        assert!(!store.may_call("a1", "b1") && !store.may_call("b1", "a1"));
        assert!(!store.may_call("a1", "ops"), "the operator's lambda is not the tenant's");
        assert!(store.may_call("ops", "a1") && store.may_call("ops", "other-ops"));
    }

    #[test]
    fn host_names_are_owned_as_lambda_names_are() {
        let store = Tenants::in_memory();
        store.add("a", 1).unwrap();
        store.add("b", 1).unwrap();
        assert_eq!(store.claim_host("a.example", "a", false), Ok(true));
        assert_eq!(store.claim_host("a.example", "b", true), Err(StoreError::NameTaken("a.example".into())));
        assert_eq!(store.claim_host("ops.example", "b", true), Err(StoreError::NameTaken("ops.example".into())));
        assert_eq!(store.host_owner("a.example").as_deref(), Some("a"));
        assert_eq!(store.remove("a"), Err(StoreError::TenantNotEmpty("a".into(), 1)));
        store.release_host("a.example").unwrap();
        store.remove("a").unwrap();
    }

    #[test]
    fn tenant_names_are_checked() {
        let store = Tenants::in_memory();
        for bad in ["", "-a", "a/b", "a b", &"x".repeat(65)] {
            assert!(matches!(store.add(bad, 1), Err(StoreError::InvalidName(_))), "{bad:?}");
        }
        store.add("ok", 1).unwrap();
        assert_eq!(store.add("ok", 1), Err(StoreError::TenantExists("ok".into())));
    }
}
