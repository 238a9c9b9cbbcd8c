//! Tenants: who may submit to this worker, how they prove it, and what each
//! may use. Read from the TOML file given with `--tenants`:
//!
//! ```toml
//! [[tenant]]
//! name = "alice"
//! token_sha256 = "<hex sha256 of alice's token>"   # `printf %s TOKEN | sha256sum`
//! weight = 2                  # optional, default 1: twice the share of weight 1
//! max_slots = 4               # optional: at most this many of its jobs at once here
//! max_job_memory = "8GiB"     # optional: its largest job here
//! operator = true             # optional: may see every tenant's usage
//! ```
//!
//! With tenants, what the worker shows about usage is private: a tenant's
//! token sees its own figures in `/v1/peers`, an operator's sees everyone's
//! (and `/metrics`), and a request without a token sees none.
//!
//! Only hashes of tokens are stored, so the file is no secret; a token is
//! checked by hashing it and looking the hash up. Without a file the worker
//! has one tenant, `default`, and asks for no token.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::Deserialize;

/// The tenant of a worker without `--tenants`.
pub const DEFAULT_TENANT: &str = "default";

/// One tenant.
#[derive(Clone, Debug, PartialEq)]
pub struct Tenant {
    /// Its name, as shown in accounts and status.
    pub name: String,
    /// Its weight in fair share. Default: 1.
    pub weight: f64,
    /// The most of its jobs that run at once on this worker.
    pub max_slots: Option<u32>,
    /// Its largest job on this worker, in bytes.
    pub max_job_memory: Option<u64>,
    /// Whether it may see every tenant's usage and accounts.
    pub operator: bool,
}

impl Tenant {
    /// A tenant with weight 1 and no limits of its own.
    pub fn new(name: &str) -> Tenant {
        Tenant {
            name: name.into(),
            weight: 1.0,
            max_slots: None,
            max_job_memory: None,
            operator: false,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tenant: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token_sha256: String,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    max_slots: Option<u32>,
    #[serde(default)]
    max_job_memory: Option<String>,
    #[serde(default)]
    operator: bool,
}

fn pseudonym(token_hash: &[u8; 32], name: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"peerwasm tenant pseudonym\0");
    h.update(token_hash);
    h.update(name.as_bytes());
    format!("~{}", hex::encode(&h.finalize()[..8]))
}

/// The tenants of a worker.
#[derive(Clone, Debug)]
pub enum Tenants {
    /// No `--tenants`: everyone is `default`, no token asked.
    Single(Arc<Tenant>),
    /// Tenants by the sha256 of their token.
    Multi(HashMap<[u8; 32], Arc<Tenant>>),
}

/// What a caller may see of tenants' usage and accounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sees {
    /// Everyone's: an operator, or a worker without tenants.
    All,
    /// Its own tenant's only.
    Only(String),
    /// No tenant's: a request without a token.
    Nobody,
}

impl Sees {
    /// Whether `tenant`'s figures may be shown.
    pub fn may_see(&self, tenant: &str) -> bool {
        match self {
            Sees::All => true,
            Sees::Only(me) => me == tenant,
            Sees::Nobody => false,
        }
    }
}

/// Why a request was not authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token no tenant has.
    Unknown,
}

impl Tenants {
    /// One tenant, `default`.
    pub fn single() -> Tenants {
        Tenants::Single(Arc::new(Tenant::new(DEFAULT_TENANT)))
    }

    /// What tenants are called in gossip that is not authenticated (a
    /// worker without `--cluster-key`), by name: with `--tenants`, a
    /// pseudonym only workers holding the same tenants file can tell
    /// (sha256 of the token's hash and the name), so whoever posts a Syn
    /// learns no tenant's name; workers map them back with
    /// [`names`](Self::names). `None` with one tenant: nothing to hide.
    pub fn pseudonyms(&self) -> Option<HashMap<String, String>> {
        let Tenants::Multi(by_hash) = self else {
            return None;
        };
        Some(
            by_hash
                .iter()
                .map(|(hash, t)| (t.name.clone(), pseudonym(hash, &t.name)))
                .collect(),
        )
    }

    /// The names behind [`pseudonyms`](Self::pseudonyms), by pseudonym.
    pub fn names(&self) -> HashMap<String, String> {
        self.pseudonyms()
            .unwrap_or_default()
            .into_iter()
            .map(|(name, p)| (p, name))
            .collect()
    }

    /// Reads a tenants file.
    pub fn load(path: &Path) -> anyhow::Result<Tenants> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Tenants::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses the TOML text of a tenants file.
    pub fn parse(text: &str) -> anyhow::Result<Tenants> {
        let file: File = toml::from_str(text)?;
        if file.tenant.is_empty() {
            bail!("no [[tenant]] entries");
        }
        let mut by_hash = HashMap::new();
        let mut names = std::collections::HashSet::new();
        for e in file.tenant {
            let mut hash = [0u8; 32];
            hex::decode_to_slice(e.token_sha256.trim(), &mut hash).map_err(|_| {
                anyhow::anyhow!("tenant {}: token_sha256 must be 64 hex digits", e.name)
            })?;
            if !names.insert(e.name.clone()) {
                bail!("tenant {} is listed twice", e.name);
            }
            let weight = e.weight.unwrap_or(1.0);
            if !(weight > 0.0 && weight.is_finite()) {
                bail!("tenant {}: weight must be a positive number", e.name);
            }
            let max_job_memory = match &e.max_job_memory {
                Some(s) => Some(
                    crate::units::parse_size(s)
                        .map_err(|err| anyhow::anyhow!("tenant {}: {err}", e.name))?,
                ),
                None => None,
            };
            let tenant = Tenant {
                name: e.name.clone(),
                weight,
                max_slots: e.max_slots,
                max_job_memory,
                operator: e.operator,
            };
            if by_hash.insert(hash, Arc::new(tenant)).is_some() {
                bail!("tenant {} has the same token as another", e.name);
            }
        }
        Ok(Tenants::Multi(by_hash))
    }

    /// Whether tenants must authenticate.
    pub fn is_multi(&self) -> bool {
        matches!(self, Tenants::Multi(_))
    }

    /// What a request with this token may see of tenants' usage; `Err`
    /// for a token no tenant has.
    pub fn sees(&self, token: Option<&str>) -> Result<Sees, AuthError> {
        match self {
            Tenants::Single(_) => Ok(Sees::All),
            Tenants::Multi(_) => match token {
                None => Ok(Sees::Nobody),
                Some(_) => {
                    let t = self.authenticate(token)?;
                    Ok(if t.operator {
                        Sees::All
                    } else {
                        Sees::Only(t.name.clone())
                    })
                }
            },
        }
    }

    /// The tenant named `name`, if there is one (a job kept across a
    /// restart names its tenant).
    pub fn by_name(&self, name: &str) -> Option<Arc<Tenant>> {
        match self {
            Tenants::Single(t) => (t.name == name).then(|| t.clone()),
            Tenants::Multi(by_hash) => by_hash.values().find(|t| t.name == name).cloned(),
        }
    }

    /// The tenant a bearer token belongs to.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Arc<Tenant>, AuthError> {
        match self {
            Tenants::Single(t) => Ok(t.clone()),
            Tenants::Multi(by_hash) => {
                let token = token.ok_or(AuthError::Missing)?;
                let hash: [u8; 32] = {
                    use sha2::Digest;
                    sha2::Sha256::digest(token.as_bytes()).into()
                };
                by_hash.get(&hash).cloned().ok_or(AuthError::Unknown)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn pseudonyms_hide_names_and_map_back() {
        let text = format!(
            "[[tenant]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n\n[[tenant]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
            sha("a"),
            sha("b")
        );
        let t = Tenants::parse(&text).unwrap();
        let p = t.pseudonyms().unwrap();
        assert!(
            !p["alice"].contains("alice") && p["alice"] != p["bob"],
            "{p:?}"
        );
        assert_eq!(t.names()[&p["bob"]], "bob");
        // Another file with the same names but other tokens: other pseudonyms.
        let other = Tenants::parse(&text.replace(&sha("a"), &sha("z"))).unwrap();
        assert_ne!(other.pseudonyms().unwrap()["alice"], p["alice"]);
        assert!(Tenants::single().pseudonyms().is_none());
    }

    #[test]
    fn parses_tenants_and_checks_tokens() {
        let text = format!(
            "[[tenant]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nweight = 2\nmax_job_memory = \"2GiB\"\n\n\
             [[tenant]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
            sha("a-secret"),
            sha("b-secret")
        );
        let t = Tenants::parse(&text).unwrap();
        let alice = t.authenticate(Some("a-secret")).unwrap();
        assert_eq!(
            (alice.name.as_str(), alice.weight, alice.max_job_memory),
            ("alice", 2.0, Some(2 << 30))
        );
        assert_eq!(t.authenticate(Some("b-secret")).unwrap().weight, 1.0);
        assert_eq!(t.authenticate(Some("wrong")), Err(AuthError::Unknown));
        assert_eq!(t.authenticate(None), Err(AuthError::Missing));
        assert_eq!(
            Tenants::single().authenticate(None).unwrap().name,
            DEFAULT_TENANT
        );
        assert_eq!(t.sees(None), Ok(Sees::Nobody));
        assert_eq!(t.sees(Some("b-secret")), Ok(Sees::Only("bob".into())));
        assert_eq!(t.sees(Some("wrong")), Err(AuthError::Unknown));
        assert_eq!(Tenants::single().sees(None), Ok(Sees::All));
        let ops = format!(
            "[[tenant]]\nname = \"ops\"\ntoken_sha256 = \"{}\"\noperator = true\n",
            sha("o")
        );
        assert_eq!(Tenants::parse(&ops).unwrap().sees(Some("o")), Ok(Sees::All));

        for bad in [
            "".to_string(),
            "[[tenant]]\nname = \"x\"\ntoken_sha256 = \"zz\"\n".to_string(),
            format!(
                "[[tenant]]\nname = \"x\"\ntoken_sha256 = \"{}\"\nweight = 0\n",
                sha("t")
            ),
            format!(
                "[[tenant]]\nname = \"x\"\ntoken_sha256 = \"{}\"\ncolour = 1\n",
                sha("t")
            ),
        ] {
            assert!(Tenants::parse(&bad).is_err(), "{bad}");
        }
    }
}
