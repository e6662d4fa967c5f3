//! The cluster's certificates (`weir cluster init-certs`): a CA of the
//! cluster's own, and for each member a certificate and key that name it.
//!
//! In `DIR`: `ca.pem` (every member trusts it), `ca.key` (kept to issue more
//! member certificates: guard it, or delete it once every member has its
//! certificate), and `node-N.pem`, `node-N.key` per member. A member's
//! certificate names the node (`node-N.weir`) and its NBD front end's client
//! endpoint (`node-<CLIENT_ID_BASE + N>.weir`), which dials the other members
//! with the same certificate. Keys are ECDSA P-256, written mode 0600.

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use weir_core::NodeId;
use weir_transport_tcp::member_name;

/// The files of member `n` in `dir`: certificate, key.
pub fn member_files(dir: &Path, n: u32) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("node-{n}.pem")),
        dir.join(format!("node-{n}.key")),
    )
}

/// The CA certificate in `dir`.
pub fn ca_file(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

/// The CA's parameters. The same every time: a member certificate issued by
/// a CA rebuilt from its key (to add members later) chains to the `ca.pem`
/// written first, which has the same name and key.
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "weir cluster CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

/// Make the cluster's CA in `dir` unless there is one, and a certificate and
/// key for each member of `nodes` that has none. Returns the members whose
/// certificates were made.
pub fn init(dir: &Path, nodes: &[u32]) -> anyhow::Result<Vec<u32>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (ca_pem, ca_key_path) = (ca_file(dir), dir.join("ca.key"));
    let (ca, ca_key) = match (ca_pem.exists(), ca_key_path.exists()) {
        (true, true) => {
            let text = std::fs::read_to_string(&ca_key_path)
                .with_context(|| format!("reading {}", ca_key_path.display()))?;
            let key = KeyPair::from_pem(&text)
                .with_context(|| format!("{}: not a private key", ca_key_path.display()))?;
            (ca_params()?.self_signed(&key)?, key)
        }
        (false, false) => {
            let key = KeyPair::generate()?;
            let ca = ca_params()?.self_signed(&key)?;
            write_private(&ca_key_path, &key.serialize_pem())?;
            std::fs::write(&ca_pem, ca.pem())
                .with_context(|| format!("writing {}", ca_pem.display()))?;
            (ca, key)
        }
        (true, false) => bail!(
            "{} exists without {}: the CA's key is needed to issue member certificates",
            ca_pem.display(),
            ca_key_path.display()
        ),
        (false, true) => bail!(
            "{} exists without {}",
            ca_key_path.display(),
            ca_pem.display()
        ),
    };
    let mut made = Vec::new();
    for &n in nodes {
        let (cert_path, key_path) = member_files(dir, n);
        if cert_path.exists() && key_path.exists() {
            continue;
        }
        let (cert, key) = member(n, &ca, &ca_key)?;
        write_private(&key_path, &key.serialize_pem())?;
        std::fs::write(&cert_path, cert.pem())
            .with_context(|| format!("writing {}", cert_path.display()))?;
        made.push(n);
    }
    Ok(made)
}

/// A certificate for member `n`, signed by the CA.
fn member(n: u32, ca: &Certificate, ca_key: &KeyPair) -> anyhow::Result<(Certificate, KeyPair)> {
    if n == 0 || n >= crate::CLIENT_ID_BASE {
        bail!("node id {n}: must be 1 to {}", crate::CLIENT_ID_BASE - 1);
    }
    let names = vec![
        member_name(NodeId(n)),
        member_name(NodeId(crate::CLIENT_ID_BASE + n)),
    ];
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("weir node {n}"));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca, ca_key)?;
    Ok((cert, key))
}

/// The NBD front end's certificates, made under the cluster CA in `dir` (by
/// [`init`] first) unless they exist: `nbd-server.pem`/`.key` naming
/// `names` (host names, or IP addresses), and `nbd-client/` holding
/// `ca-cert.pem`, `client-cert.pem` and `client-key.pem`, the layout qemu's
/// `tls-creds-x509` (`dir=`) and libnbd (`tls-certificates=`) read.
pub fn init_nbd(dir: &Path, names: &[String]) -> anyhow::Result<()> {
    // The same CA signs member certificates: an NBD front end's certificate
    // must never name a member (its key sits on every host).
    if let Some(name) = names
        .iter()
        .find(|n| n.to_ascii_lowercase().ends_with(".weir"))
    {
        bail!("NBD name {name:?}: names ending in .weir are members' names");
    }
    let key_text = std::fs::read_to_string(dir.join("ca.key")).with_context(|| {
        format!(
            "reading {} (weir cluster init-certs first)",
            dir.join("ca.key").display()
        )
    })?;
    let ca_key = KeyPair::from_pem(&key_text)?;
    let ca = ca_params()?.self_signed(&ca_key)?;
    let (server_pem, server_key) = (dir.join("nbd-server.pem"), dir.join("nbd-server.key"));
    if !server_pem.exists() {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        for name in names {
            params
                .subject_alt_names
                .push(match name.parse::<std::net::IpAddr>() {
                    Ok(ip) => rcgen::SanType::IpAddress(ip),
                    Err(_) => rcgen::SanType::DnsName(name.as_str().try_into()?),
                });
        }
        params
            .distinguished_name
            .push(DnType::CommonName, "weir NBD front end");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        write_private(&server_key, &key.serialize_pem())?;
        std::fs::write(&server_pem, cert.pem())?;
    }
    let client = dir.join("nbd-client");
    if !client.join("client-cert.pem").exists() {
        std::fs::create_dir_all(&client)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "weir NBD client");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        std::fs::copy(ca_file(dir), client.join("ca-cert.pem"))?;
        write_private(&client.join("client-key.pem"), &key.serialize_pem())?;
        std::fs::write(client.join("client-cert.pem"), cert.pem())?;
    }
    Ok(())
}

/// Write `text` to `path`, readable by its owner only.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn members_added_later_chain_to_the_first_ca_and_keys_are_private() {
        let dir = std::env::temp_dir().join(format!("weir-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(init(&dir, &[1, 2]).unwrap(), [1, 2]);
        // Again, with one more: only the new one is made, by the same CA.
        assert_eq!(init(&dir, &[1, 2, 3]).unwrap(), [3]);
        let ca = std::fs::read(ca_file(&dir)).unwrap();
        for n in [1, 3] {
            let (cert, key) = member_files(&dir, n);
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let identity = weir_transport_tcp::TlsIdentity::from_pem(
                &ca,
                &std::fs::read(cert).unwrap(),
                &std::fs::read(key).unwrap(),
            );
            assert!(identity.is_ok(), "node {n}: {identity:?}");
        }
        assert!(init(&dir, &[0]).is_err());
        assert!(
            init_nbd(&dir, &["node-1.weir".into()]).is_err(),
            "a member's name"
        );
        init_nbd(&dir, &["localhost".into(), "127.0.0.1".into()]).unwrap();
        assert!(dir.join("nbd-client/client-cert.pem").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio_real::test(crate = "tokio_real")]
    async fn a_member_certified_later_and_a_front_end_reach_a_member_certified_first() {
        use weir_core::transport::Transport;
        use weir_core::wire::Message;
        use weir_transport_tcp::{TcpConfig, TcpTransport, TlsIdentity};
        let dir = std::env::temp_dir().join(format!("weir-certs-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        init(&dir, &[1]).unwrap();
        init(&dir, &[1, 2]).unwrap();
        let ca = std::fs::read(ca_file(&dir)).unwrap();
        let config = |n: u32| {
            let (cert, key) = member_files(&dir, n);
            let tls = TlsIdentity::from_pem(
                &ca,
                &std::fs::read(cert).unwrap(),
                &std::fs::read(key).unwrap(),
            )
            .unwrap();
            TcpConfig {
                tls: Some(tls),
                ..TcpConfig::default()
            }
        };
        let a = TcpTransport::bind(
            NodeId(1),
            Some("127.0.0.1:0".parse().unwrap()),
            Default::default(),
            config(1),
        )
        .await
        .unwrap();
        let peers = [(NodeId(1), a.local_addr().unwrap())].into_iter().collect();
        // Node 2, and node 2's front end (its certificate names both).
        for id in [2, crate::CLIENT_ID_BASE + 2] {
            let b = TcpTransport::bind(
                NodeId(id),
                None,
                std::collections::BTreeMap::clone(&peers),
                config(2),
            )
            .await
            .unwrap();
            let msg = Message::WriteOk {
                req: weir_core::RequestId(u64::from(id)),
            };
            b.send(NodeId(1), msg.encode().unwrap()).unwrap();
            let (from, frame) =
                tokio_real::time::timeout(std::time::Duration::from_secs(30), a.recv())
                    .await
                    .expect("a frame within 30 s")
                    .unwrap();
            assert_eq!((from, Message::decode(frame).unwrap()), (NodeId(id), msg));
        }
        assert_eq!(a.refused_connections(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
