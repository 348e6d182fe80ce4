//! `backend = "rbd"`: a namespace backed by a Ceph RBD image, its keys,
//! the `--rbd POOL/IMAGE` quick form, and the rules across namespaces.

use super::error::{invalid, ConfigError};
use super::raw::{duration_value, RawDuration};
use std::path::PathBuf;
use std::time::Duration;

/// Where Ceph's tools look for the cluster configuration by default.
pub const DEFAULT_CEPH_CONF: &str = "/etc/ceph/ceph.conf";
/// The client id used when none is given (`client.admin`).
pub const DEFAULT_CLIENT_ID: &str = "admin";
/// How long a cluster operation may take before it fails: below the 30 s
/// after which the Linux host gives up on a command and resets the
/// controller, so that the host sees a retryable status first.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);
/// The Linux host's default I/O timeout (nvme_core.io_timeout).
const HOST_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// An RBD image and how to reach its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdImage {
    pub pool: String,
    /// RBD namespace inside the pool; `None` for the pool's default one.
    pub namespace: Option<String>,
    pub image: String,
    /// The cluster's ceph.conf (monitors, authentication).
    pub ceph_conf: PathBuf,
    /// Ceph client id: the target connects as `client.<id>`.
    pub client_id: String,
    /// Keyring of the client, when ceph.conf does not name it.
    pub keyring: Option<PathBuf>,
    /// rados_osd_op_timeout, rados_mon_op_timeout and client_mount_timeout.
    pub timeout: Duration,
}

impl RbdImage {
    /// `pool[/namespace]/image`, as the rbd tool writes it.
    pub fn spec(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.pool, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }

    /// The cluster connection this image shares with others.
    pub fn cluster_key(&self) -> (PathBuf, String) {
        (self.ceph_conf.clone(), self.client_id.clone())
    }
}

/// The keys of a namespace table only `backend = "rbd"` uses.
#[derive(Debug, Default)]
pub(super) struct RawRbd {
    pub pool: Option<String>,
    pub image: Option<String>,
    pub rbd_namespace: Option<String>,
    pub ceph_conf: Option<PathBuf>,
    pub client_id: Option<String>,
    pub keyring: Option<PathBuf>,
    pub timeout: Option<RawDuration>,
}

impl RawRbd {
    /// An RBD key that is set, if any (they belong to `backend = "rbd"` only).
    pub(super) fn any(&self) -> Option<&'static str> {
        [
            ("pool", self.pool.is_some()),
            ("image", self.image.is_some()),
            ("rbd_namespace", self.rbd_namespace.is_some()),
            ("ceph_conf", self.ceph_conf.is_some()),
            ("client_id", self.client_id.is_some()),
            ("keyring", self.keyring.is_some()),
            ("timeout", self.timeout.is_some()),
        ]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
    }
}

/// The image of namespace table `key`.
pub(super) fn convert(key: &str, raw: RawRbd) -> Result<RbdImage, ConfigError> {
    let name = |k: &str, v: Option<String>, example: &str| {
        v.filter(|s| !s.is_empty()).ok_or_else(|| {
            invalid(
                format!("{key}.{k}"),
                format!("missing or empty; backend = \"rbd\" needs {k} = \"{example}\""),
            )
        })
    };
    let image = RbdImage {
        pool: name("pool", raw.pool, "rbd")?,
        image: name("image", raw.image, "disk1")?,
        namespace: raw.rbd_namespace.filter(|s| !s.is_empty()),
        ceph_conf: raw
            .ceph_conf
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CEPH_CONF)),
        client_id: raw
            .client_id
            .unwrap_or_else(|| DEFAULT_CLIENT_ID.to_string()),
        keyring: raw.keyring,
        timeout: match &raw.timeout {
            None => DEFAULT_TIMEOUT,
            Some(t) => duration_value(&format!("{key}.timeout"), t)?,
        },
    };
    validate(key, &image)?;
    Ok(image)
}

/// The rules of one image's keys.
pub(super) fn validate(key: &str, i: &RbdImage) -> Result<(), ConfigError> {
    for (k, v) in [
        ("pool", i.pool.as_str()),
        ("image", i.image.as_str()),
        ("client_id", i.client_id.as_str()),
    ] {
        if v.is_empty() || v.contains(['/', '\0', '@']) {
            return Err(invalid(
                format!("{key}.{k}"),
                format!("{v:?} is not a valid name (empty, or holds '/', '@' or NUL)"),
            ));
        }
    }
    if i.client_id.starts_with("client.") {
        return Err(invalid(
            format!("{key}.client_id"),
            format!(
                "{:?}: give the id without \"client.\" (the target connects as client.ID)",
                i.client_id
            ),
        ));
    }
    if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&i.timeout) {
        return Err(invalid(
            format!("{key}.timeout"),
            "give 1s to 300s (the default, 20s, stays below the Linux host's 30 s I/O timeout)",
        ));
    }
    Ok(())
}

/// Namespaces that share a cluster connection (the same ceph.conf and
/// client id) must agree on its keyring and timeout: they are settings of
/// the connection. An image is exported once (twice, its two namespaces
/// would have the same identifiers). `images` are (key, image) pairs.
pub(super) fn validate_shared<'a>(
    images: impl Iterator<Item = (String, &'a RbdImage)>,
) -> Result<(), ConfigError> {
    let mut seen: Vec<(String, &RbdImage)> = Vec::new();
    for (key, i) in images {
        let same_image =
            |f: &&(String, &RbdImage)| f.1.ceph_conf == i.ceph_conf && f.1.spec() == i.spec();
        if let Some((first, _)) = seen.iter().find(same_image) {
            return Err(invalid(
                key,
                format!(
                    "exports image {} again (as {first}); export each image once",
                    i.spec()
                ),
            ));
        }
        if let Some((first, f)) = seen
            .iter()
            .find(|(_, f)| f.cluster_key() == i.cluster_key())
        {
            if f.keyring != i.keyring || f.timeout != i.timeout {
                return Err(invalid(
                    key,
                    format!(
                        "shares its cluster connection (ceph_conf and client_id) with {first} \
                         but sets another keyring or timeout; give both the same"
                    ),
                ));
            }
        }
        seen.push((key, i));
    }
    Ok(())
}

/// A warning for a timeout the Linux host would not wait for.
pub(super) fn warning(key: &str, i: &RbdImage) -> Option<String> {
    (i.timeout >= HOST_IO_TIMEOUT).then(|| {
        format!(
            "{key}.timeout is {:?}: the Linux host resets the controller after 30 s \
             (nvme_core.io_timeout) before a timed-out I/O could answer; use less, e.g. 20s",
            i.timeout
        )
    })
}

/// The quick form: `--rbd POOL/IMAGE` or `POOL/NAMESPACE/IMAGE`, with
/// `--ceph-conf` and `--ceph-id`.
pub(super) fn from_quick_args(
    spec: &str,
    ceph_conf: Option<&PathBuf>,
    client_id: Option<&str>,
) -> Result<RbdImage, ConfigError> {
    let parts: Vec<&str> = spec.split('/').collect();
    let (pool, namespace, image) = match parts[..] {
        [p, i] => (p, None, i),
        [p, n, i] => (p, Some(n.to_string()), i),
        _ => {
            return Err(invalid(
                "--rbd",
                format!("{spec:?}: give POOL/IMAGE or POOL/NAMESPACE/IMAGE, e.g. rbd/disk1"),
            ))
        }
    };
    let image = RbdImage {
        pool: pool.to_string(),
        namespace,
        image: image.to_string(),
        ceph_conf: ceph_conf
            .cloned()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CEPH_CONF)),
        client_id: client_id.unwrap_or(DEFAULT_CLIENT_ID).to_string(),
        keyring: None,
        timeout: DEFAULT_TIMEOUT,
    };
    validate("--rbd", &image)?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_invalid;
    use super::super::{parse, BackendConfig};
    use super::*;

    /// A configuration whose subsystem has `subsystem` keys and the
    /// namespace tables `namespaces`.
    fn config(subsystem: &str, namespaces: &[&str]) -> String {
        let mut text = format!(
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\
             [[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n{subsystem}\n"
        );
        for ns in namespaces {
            text.push_str(&format!("[[subsystem.namespace]]\n{ns}\n"));
        }
        text
    }

    #[test]
    fn an_image_with_defaults_and_with_every_key() {
        let c = parse(&config(
            "",
            &["backend = \"rbd\"\npool = \"rbd\"\nimage = \"d1\""],
        ))
        .expect("valid");
        let BackendConfig::Rbd(i) = &c.subsystems[0].namespaces[0].backend else {
            panic!("an RBD backend");
        };
        assert_eq!(i.spec(), "rbd/d1");
        assert_eq!(i.ceph_conf, PathBuf::from(DEFAULT_CEPH_CONF));
        assert_eq!(i.client_id, DEFAULT_CLIENT_ID);
        assert_eq!(i.timeout, DEFAULT_TIMEOUT);
        assert!(c.warnings().is_empty());

        let all = "backend = \"rbd\"\npool = \"p\"\nimage = \"d2\"\nrbd_namespace = \"t\"\n\
                   ceph_conf = \"/c/ceph.conf\"\nclient_id = \"gw\"\nkeyring = \"/c/k\"\ntimeout = \"45s\"";
        let c = parse(&config("", &[all])).expect("valid");
        let BackendConfig::Rbd(i) = &c.subsystems[0].namespaces[0].backend else {
            panic!("an RBD backend");
        };
        assert_eq!(i.spec(), "p/t/d2");
        assert_eq!(i.keyring, Some(PathBuf::from("/c/k")));
        assert_eq!(i.timeout, Duration::from_secs(45));
        assert!(
            c.warnings()[0].contains("30 s"),
            "a timeout above the host's is a warning: {:?}",
            c.warnings()
        );
    }

    #[test]
    fn image_keys_are_checked() {
        let ns = "subsystem[0].namespace[0]";
        for (body, key, part) in [
            ("backend = \"rbd\"\nimage = \"d\"", "pool", "missing"),
            ("backend = \"rbd\"\npool = \"rbd\"", "image", "missing"),
            (
                "backend = \"rbd\"\npool = \"a/b\"\nimage = \"d\"",
                "pool",
                "not a valid name",
            ),
            (
                "backend = \"rbd\"\npool = \"p\"\nimage = \"d\"\nsize = \"1GiB\"",
                "size",
                "image's",
            ),
            (
                "backend = \"rbd\"\npool = \"p\"\nimage = \"d\"\npath = \"/x\"",
                "path",
                "takes no path",
            ),
            (
                "backend = \"rbd\"\npool = \"p\"\nimage = \"d\"\ntimeout = \"0s\"",
                "timeout",
                "1s to 300s",
            ),
            (
                "backend = \"memory\"\nsize = \"1GiB\"\npool = \"p\"",
                "pool",
                "only backend = \"rbd\"",
            ),
        ] {
            assert_invalid(&config("", &[body]), &format!("{ns}.{key}"), part);
        }
        assert_invalid(
            &config(
                "",
                &["backend = \"rbd\"\npool = \"p\"\nimage = \"d\"\nclient_id = \"client.gw\""],
            ),
            &format!("{ns}.client_id"),
            "without \"client.\"",
        );
        let a = "backend = \"rbd\"\npool = \"p\"\nimage = \"a\"";
        assert_invalid(&config("", &[a, a]), "subsystem[0].namespace[1]", "again");
        // Two images on one connection with different timeouts.
        let a = "backend = \"rbd\"\npool = \"p\"\nimage = \"a\"";
        let b = "backend = \"rbd\"\npool = \"p\"\nimage = \"b\"\ntimeout = \"10s\"";
        assert_invalid(
            &config("", &[a, b]),
            "subsystem[0].namespace[1]",
            "namespace[0]",
        );
        let b_elsewhere = format!("{b}\nclient_id = \"other\"");
        parse(&config("", &[a, &b_elsewhere])).expect("another client is another connection");
    }

    #[test]
    fn controller_id_ranges() {
        let ns = ["backend = \"memory\"\nsize = \"1GiB\""];
        let c = parse(&config("cntlid_min = 100\ncntlid_max = 199", &ns)).expect("valid");
        assert_eq!(c.subsystems[0].cntlids, 100..=199);
        let c = parse(&config("", &ns)).expect("valid");
        assert_eq!(c.subsystems[0].cntlids, 1..=super::super::MAX_CNTLID);
        assert_invalid(
            &config("cntlid_min = 0", &ns),
            "subsystem[0].cntlid_min",
            "1 to 65519",
        );
        assert_invalid(
            &config("cntlid_max = 65520", &ns),
            "subsystem[0].cntlid_max",
            "1 to 65519",
        );
        assert_invalid(
            &config("cntlid_min = 10\ncntlid_max = 9", &ns),
            "subsystem[0].cntlid_max",
            "below cntlid_min",
        );
    }

    #[test]
    fn the_shipped_example_parses() {
        let c = parse(include_str!("../../../config/rbd.toml")).expect("config/rbd.toml is valid");
        let s = &c.subsystems[0];
        assert_eq!(s.cntlids, 1..=1000);
        let specs: Vec<String> = s
            .namespaces
            .iter()
            .map(|n| match &n.backend {
                BackendConfig::Rbd(i) => i.spec(),
                other => panic!("not RBD: {other:?}"),
            })
            .collect();
        assert_eq!(specs, ["rbd/vm-disk-1", "rbd/tenant-a/data"]);
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    }

    #[test]
    fn the_quick_form() {
        let i = from_quick_args("rbd/ns1/disk", None, Some("gw")).expect("valid");
        assert_eq!(
            (i.spec().as_str(), i.client_id.as_str()),
            ("rbd/ns1/disk", "gw")
        );
        for bad in ["disk", "a/b/c/d", "/disk", "rbd/"] {
            assert!(from_quick_args(bad, None, None).is_err(), "{bad} accepted");
        }
    }
}
