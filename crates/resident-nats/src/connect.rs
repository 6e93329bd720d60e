//! Connecting a worker to NATS securely: credentials (a `.creds` file, an nkey seed file, user
//! and password, a token) and TLS (a CA, a client certificate, TLS required).
//!
//! Every file is read and checked before the first byte goes to the server, so a missing or
//! malformed file is a typed error naming the file, not a refused connection. A refused
//! connection says why (credentials refused, TLS handshake failed, unreachable). Secrets are
//! [`Secret`]s: their `Debug` prints `<redacted>`, they have no `Display`, and a URL with a
//! password in it is printed with the password replaced. By default a connection without TLS
//! to a server that is not on loopback is refused ([`NatsOptions::allow_plaintext`]).
//!
//! A worker that is already serving can still be refused: the server restarted with other
//! credentials (every reconnect is refused) or the account may not publish to a subject. The
//! client would retry such a reconnect forever and drop such a publish silently; the
//! [`Connection`] made here notices both ([`Fault`]) and the serving loops stop with
//! [`ServeError::Refused`](crate::ServeError::Refused) instead.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_nats::rustls::pki_types::pem::PemObject;
use async_nats::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use async_nats::{Client, ConnectErrorKind, Event, ServerAddr};
use tokio::sync::watch;

/// A password or token: kept out of every `Debug` output and error message.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself (only to hand it to the client).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

/// How the worker proves who it is. One method per connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Credentials {
    /// None (an open server, or identity from the TLS client certificate).
    #[default]
    None,
    /// A `.creds` file (user JWT and nkey seed, as `nsc` writes it): decentralized auth.
    CredsFile(PathBuf),
    /// A file holding a user nkey seed (`SU...`): the server knows the public key.
    NkeyFile(PathBuf),
    /// User and password.
    UserPassword {
        /// The user name.
        user: String,
        /// The password.
        password: Secret,
    },
    /// A token.
    Token(Secret),
}

/// TLS settings. Giving a CA, a client certificate or `required` makes the client require TLS
/// (a server without TLS is then refused, never used in plaintext).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of the CA(s) that signed the server's certificate (default: the system's
    /// roots).
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate (mutual TLS); needs `key`.
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key; needs `cert`.
    pub key: Option<PathBuf>,
    /// Require TLS even without a CA or client certificate (the system's roots verify the
    /// server).
    pub required: bool,
}

impl TlsOptions {
    /// Whether the client will require TLS.
    pub fn enabled(&self) -> bool {
        self.required || self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }
}

/// Where and how to connect.
#[derive(Clone, Debug)]
pub struct NatsOptions {
    /// Server URL, or several separated by commas (`nats://` or `tls://`).
    pub url: String,
    /// Credentials.
    pub credentials: Credentials,
    /// TLS.
    pub tls: TlsOptions,
    /// Allow a connection without TLS to a server that is not on loopback (default false:
    /// credentials and data would cross the network readable by anyone on the path).
    pub allow_plaintext: bool,
    /// Connection name shown by the server (`nats server report connections`).
    pub name: Option<String>,
    /// How long one connection attempt (TCP, TLS, CONNECT) may take.
    pub connection_timeout: Duration,
}

impl NatsOptions {
    /// No credentials, no TLS, plaintext refused off loopback, 5 s connection timeout.
    pub fn new(url: impl Into<String>) -> Self {
        NatsOptions {
            url: url.into(),
            credentials: Credentials::None,
            tls: TlsOptions::default(),
            allow_plaintext: false,
            name: None,
            connection_timeout: Duration::from_secs(5),
        }
    }

    /// The servers of `url`, parsed.
    fn servers(&self) -> Result<Vec<ServerAddr>, ConnectError> {
        let servers: Vec<ServerAddr> = self
            .url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                ServerAddr::from_str(s).map_err(|e| ConnectError::BadUrl {
                    url: redact_url(s),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        if servers.is_empty() {
            return Err(ConnectError::BadUrl {
                url: String::new(),
                reason: "no server given".into(),
            });
        }
        Ok(servers)
    }

    /// Checks the options and every file they name, without connecting: the servers parse,
    /// plaintext is allowed where it would be used, one credential method, certificate and key
    /// together, every file readable and of the right kind.
    pub fn check(&self) -> Result<(), ConnectError> {
        let servers = self.servers()?;
        for s in &servers {
            if s.has_user_pass() && self.credentials != Credentials::None {
                return Err(ConnectError::Options(
                    "the URL carries a user and password and other credentials are given too; use one",
                ));
            }
            let tls = self.tls.enabled() || s.tls_required() || s.scheme() == "wss";
            if !tls && !self.allow_plaintext && !is_loopback(s.host()) {
                return Err(ConnectError::Plaintext {
                    server: redact_url(s.as_url_str()),
                });
            }
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return Err(ConnectError::Options(
                "a TLS client certificate needs its key, and a key its certificate (give both)",
            ));
        }
        if let Some(ca) = &self.tls.ca {
            let pem = read("CA file", ca)?;
            if CertificateDer::pem_slice_iter(&pem).next().is_none() {
                return Err(bad("CA file", ca, "no PEM certificate in it"));
            }
            if CertificateDer::pem_slice_iter(&pem).any(|c| c.is_err()) {
                return Err(bad("CA file", ca, "a PEM certificate in it does not parse"));
            }
        }
        if let (Some(cert), Some(key)) = (&self.tls.cert, &self.tls.key) {
            let pem = read("client certificate", cert)?;
            if CertificateDer::pem_slice_iter(&pem).next().is_none() {
                return Err(bad("client certificate", cert, "no PEM certificate in it"));
            }
            let pem = read("client key", key)?;
            if PrivateKeyDer::from_pem_slice(&pem).is_err() {
                return Err(bad("client key", key, "no PEM private key in it"));
            }
        }
        match &self.credentials {
            Credentials::None | Credentials::Token(_) => {}
            Credentials::UserPassword { user, .. } if user.is_empty() => {
                return Err(ConnectError::Options("the user name is empty"));
            }
            Credentials::UserPassword { .. } => {}
            Credentials::NkeyFile(path) => {
                nkey_seed(path)?;
            }
            Credentials::CredsFile(path) => {
                let text = String::from_utf8(read("credentials file", path)?)
                    .map_err(|_| bad("credentials file", path, "not text"))?;
                async_nats::ConnectOptions::new()
                    .credentials(&text)
                    .map_err(|e| bad("credentials file", path, &e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Checks the options ([`check`](Self::check)), then connects once: a refused or failed
    /// first connection is an error at once (no retry). After that the client reconnects by
    /// itself (100 ms steps, at most 1 s apart) unless the server refuses the credentials or a
    /// permission, which the returned [`Connection`] reports as a [`Fault`].
    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        self.check()?;
        let servers = self.servers()?;
        let (fault_tx, fault_rx) = watch::channel(None);
        let mut o = async_nats::ConnectOptions::new()
            .connection_timeout(self.connection_timeout)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((attempts as u64 * 100).clamp(100, 1000))
            })
            .event_callback(move |event| {
                let fault = Fault::of(&event);
                let tx = fault_tx.clone();
                async move {
                    if let Some(f) = fault {
                        // The first fault stays: it is the cause.
                        tx.send_if_modified(|cur| {
                            if cur.is_none() {
                                *cur = Some(f);
                                true
                            } else {
                                false
                            }
                        });
                    }
                }
            });
        if let Some(name) = &self.name {
            o = o.name(name);
        }
        o = match &self.credentials {
            Credentials::None => o,
            Credentials::Token(t) => o.token(t.expose().to_string()),
            Credentials::UserPassword { user, password } => {
                o.user_and_password(user.clone(), password.expose().to_string())
            }
            Credentials::NkeyFile(path) => o.nkey(nkey_seed(path)?),
            Credentials::CredsFile(path) => {
                let text = String::from_utf8(read("credentials file", path)?)
                    .map_err(|_| bad("credentials file", path, "not text"))?;
                o.credentials(&text)
                    .map_err(|e| bad("credentials file", path, &e.to_string()))?
            }
        };
        if self.tls.enabled() {
            o = o.require_tls(true);
        }
        if let Some(ca) = &self.tls.ca {
            o = o.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.tls.cert, &self.tls.key) {
            o = o.add_client_certificate(cert.clone(), key.clone());
        }
        let shown = servers
            .iter()
            .map(|s| redact_url(s.as_url_str()))
            .collect::<Vec<_>>()
            .join(",");
        let client = o
            .connect(servers)
            .await
            .map_err(|e| ConnectError::of(shown, e))?;
        Ok(Connection {
            client,
            faults: Some(fault_rx),
        })
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::ReadFile {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn bad(what: &'static str, path: &Path, reason: &str) -> ConnectError {
    ConnectError::BadFile {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Reads a user nkey seed from a file (the first line starting with `SU`, as `nk -gen user`
/// writes it, or the file's only word) and checks it decodes.
fn nkey_seed(path: &Path) -> Result<String, ConnectError> {
    let text = String::from_utf8(read("nkey seed file", path)?)
        .map_err(|_| bad("nkey seed file", path, "not text"))?;
    let seed = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with('S'))
        .ok_or_else(|| bad("nkey seed file", path, "no seed (a line starting with 'S')"))?;
    // nkeys' errors name the defect (checksum, length, prefix), never the seed.
    match nkeys::KeyPair::from_seed(seed) {
        Ok(kp) if matches!(kp.key_pair_type(), nkeys::KeyPairType::User) => Ok(seed.to_string()),
        Ok(_) => Err(bad(
            "nkey seed file",
            path,
            "the seed is not a user seed (SU...)",
        )),
        Err(e) => Err(bad("nkey seed file", path, &format!("invalid seed: {e}"))),
    }
}

/// Whether `host` is this machine: `localhost` or a loopback address.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The URL with any password in it replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return match url.rfind('@') {
            Some(at) => format!("***@{}", &url[at + 1..]),
            None => url.to_string(),
        };
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_string()
            };
            format!("{}{shown}@{}", &url[..scheme_end], &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

/// Why a connection could not be made. No variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse.
    #[error("invalid NATS server URL '{url}': {reason}")]
    BadUrl {
        /// The URL (password replaced).
        url: String,
        /// Why.
        reason: String,
    },
    /// The options contradict each other or miss a part.
    #[error("invalid NATS connection options: {0}")]
    Options(&'static str),
    /// Plaintext to a server off loopback, not allowed.
    #[error(
        "refusing a plaintext connection to {server}: it is not on loopback, so credentials and \
         data would cross the network unencrypted. Use TLS (a tls:// URL, --tls-required, \
         --tls-ca) or allow plaintext explicitly (--allow-plaintext)"
    )]
    Plaintext {
        /// The server (password replaced).
        server: String,
    },
    /// A file could not be read.
    #[error("cannot read the {what} '{}': {source}", path.display())]
    ReadFile {
        /// Which file (CA file, client certificate, client key, credentials file, nkey seed
        /// file).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but is not what it should be.
    #[error("the {what} '{}' is not usable: {reason}", path.display())]
    BadFile {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong (never the file's content).
        reason: String,
    },
    /// The server refused the credentials.
    #[error(
        "cannot connect to NATS at '{url}': the server refused the credentials (authorization \
         violation)"
    )]
    Unauthorized {
        /// The URL (password replaced).
        url: String,
    },
    /// The credentials could not be used to sign the server's challenge.
    #[error("cannot connect to NATS at '{url}': signing the server's nonce failed: {detail}")]
    Authentication {
        /// The URL (password replaced).
        url: String,
        /// The client's reason.
        detail: String,
    },
    /// TLS failed: the server's certificate was not trusted, the server refused ours, the
    /// server has no TLS although it is required, or the TLS files were refused.
    #[error("cannot connect to NATS at '{url}': TLS failed: {detail}")]
    Tls {
        /// The URL (password replaced).
        url: String,
        /// The TLS library's reason.
        detail: String,
    },
    /// Anything else: nothing listens, timeout, DNS.
    #[error("cannot connect to NATS at '{url}': {source}")]
    Unreachable {
        /// The URL (password replaced).
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
}

impl ConnectError {
    fn of(url: String, e: async_nats::ConnectError) -> ConnectError {
        // A TLS failure inside the handshake surfaces as an I/O error whose source is the TLS
        // library's error; find it in the chain.
        let tls_detail = || {
            let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = cur {
                if let Some(t) = err.downcast_ref::<async_nats::rustls::Error>() {
                    return Some(t.to_string());
                }
                if let Some(io) = err.downcast_ref::<std::io::Error>() {
                    if let Some(t) = io
                        .get_ref()
                        .and_then(|i| i.downcast_ref::<async_nats::rustls::Error>())
                    {
                        return Some(t.to_string());
                    }
                }
                cur = err.source();
            }
            None
        };
        match e.kind() {
            ConnectErrorKind::AuthorizationViolation => ConnectError::Unauthorized { url },
            ConnectErrorKind::Authentication => ConnectError::Authentication {
                url,
                detail: e.to_string(),
            },
            ConnectErrorKind::Tls => ConnectError::Tls {
                detail: tls_detail().unwrap_or_else(|| e.to_string()),
                url,
            },
            _ => match tls_detail() {
                Some(detail) if detail.contains("fatal alert") => ConnectError::Tls {
                    url,
                    detail: format!(
                        "{detail} (the server refused the handshake: most often it requires a \
                         client certificate it trusts, --tls-cert/--tls-key)"
                    ),
                },
                Some(detail) => ConnectError::Tls { url, detail },
                None => {
                    let text = e.to_string();
                    // The server requires TLS and we did not ask for it, or the reverse.
                    if text.contains("TLS") || text.contains("tls") {
                        ConnectError::Tls { url, detail: text }
                    } else {
                        ConnectError::Unreachable { url, source: e }
                    }
                }
            },
        }
    }
}

/// Why a connected worker cannot go on: retrying would not help.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// The server refused the credentials (on a reconnect: it restarted with others, or they
    /// were revoked).
    #[error("the server refused the credentials (authorization violation)")]
    Unauthorized,
    /// The server refused a publish or subscribe (the server's text names the subject).
    #[error("permission denied by the server: {0}")]
    PermissionDenied(String),
}

impl Fault {
    fn of(event: &Event) -> Option<Fault> {
        use async_nats::{ClientError, ServerError};
        match event {
            Event::ServerError(ServerError::AuthorizationViolation) => Some(Fault::Unauthorized),
            Event::ServerError(ServerError::Other(text))
                if text.to_ascii_lowercase().contains("permissions violation") =>
            {
                Some(Fault::PermissionDenied(text.trim_matches('\'').to_string()))
            }
            // A reconnect refused: the connector reports its error kind's text and retries.
            Event::ClientError(ClientError::Other(text))
                if text == &ConnectErrorKind::AuthorizationViolation.to_string()
                    || text == &ConnectErrorKind::Authentication.to_string() =>
            {
                Some(Fault::Unauthorized)
            }
            _ => None,
        }
    }
}

/// A client and the faults its server reported. A plain `async_nats::Client` converts into one
/// (it then reports no faults). Clones share the client and its faults.
#[derive(Clone)]
pub struct Connection {
    /// The client.
    pub client: Client,
    faults: Option<watch::Receiver<Option<Fault>>>,
}

impl From<Client> for Connection {
    fn from(client: Client) -> Self {
        Connection {
            client,
            faults: None,
        }
    }
}

impl Connection {
    /// The first fault reported so far, if any.
    pub fn fault(&self) -> Option<Fault> {
        self.faults.as_ref().and_then(|f| f.borrow().clone())
    }

    /// A watcher of the faults, for the serving loops.
    pub(crate) fn fault_watch(&self) -> FaultWatch {
        FaultWatch(self.faults.clone())
    }
}

/// Completes when the server reports a [`Fault`]; never without one.
#[derive(Clone)]
pub(crate) struct FaultWatch(Option<watch::Receiver<Option<Fault>>>);

impl FaultWatch {
    /// The fault reported so far, if any.
    pub(crate) fn current(&self) -> Option<Fault> {
        self.0.as_ref().and_then(|f| f.borrow().clone())
    }

    pub(crate) async fn wait(&mut self) -> Fault {
        if let Some(rx) = &mut self.0 {
            if let Ok(f) = rx.wait_for(|f| f.is_some()).await {
                if let Some(f) = f.clone() {
                    return f;
                }
            }
        }
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_url_passwords_are_never_printed() {
        let mut o = NatsOptions::new("nats://bob:hunter2@10.0.0.5:4222");
        o.credentials = Credentials::Token(Secret::new("tok-s3cret"));
        let dbg = format!("{o:?}");
        assert!(!dbg.contains("tok-s3cret"), "{dbg}");
        assert!(dbg.contains("<redacted>"));
        let p = Credentials::UserPassword {
            user: "u".into(),
            password: "pw-s3cret".parse().unwrap(),
        };
        assert!(!format!("{p:?}").contains("pw-s3cret"));
        assert_eq!(
            redact_url("nats://bob:hunter2@10.0.0.5:4222"),
            "nats://bob:***@10.0.0.5:4222"
        );
        assert_eq!(
            redact_url("tls://tok@h:1/x@y"),
            "tls://***@h:1/x@y",
            "a token in the URL is hidden, the path is not userinfo"
        );
        assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
        // The URL's own credentials clash with the token, and the error does not echo them.
        let e = o.check().unwrap_err().to_string();
        assert!(!e.contains("hunter2") && !e.contains("tok-s3cret"), "{e}");
    }

    #[test]
    fn plaintext_off_loopback_is_refused_unless_allowed() {
        for ok in [
            "nats://127.0.0.1:4222",
            "nats://localhost:4222",
            "nats://[::1]:4222",
            "127.0.0.2",
        ] {
            NatsOptions::new(ok).check().unwrap();
        }
        let mut o = NatsOptions::new("nats://127.0.0.1:4222,nats://nats.example.com:4222");
        let e = o.check().unwrap_err();
        assert!(matches!(e, ConnectError::Plaintext { .. }), "{e}");
        assert!(e.to_string().contains("--allow-plaintext"), "{e}");
        o.allow_plaintext = true;
        o.check().unwrap();
        o.allow_plaintext = false;
        o.tls.required = true;
        o.check().unwrap();
        NatsOptions::new("tls://nats.example.com:4222")
            .check()
            .unwrap();
    }

    #[test]
    fn files_are_checked_before_connecting() {
        let dir =
            std::env::temp_dir().join(format!("resident-nats-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut o = NatsOptions::new("nats://127.0.0.1:4222");
        o.tls.ca = Some(dir.join("missing.pem"));
        let e = o.check().unwrap_err();
        assert!(
            matches!(
                e,
                ConnectError::ReadFile {
                    what: "CA file",
                    ..
                }
            ),
            "{e}"
        );
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        o.tls.ca = Some(junk.clone());
        assert!(matches!(o.check(), Err(ConnectError::BadFile { .. })));
        o.tls.ca = None;
        o.tls.cert = Some(junk.clone());
        assert!(matches!(o.check(), Err(ConnectError::Options(_))));
        o.tls.cert = None;
        let seed = dir.join("seed.nk");
        std::fs::write(&seed, "SUAXXXXINVALIDSEEDXXXX\n").unwrap();
        o.credentials = Credentials::NkeyFile(seed.clone());
        let e = o.check().unwrap_err().to_string();
        assert!(
            e.contains("nkey seed file") && !e.contains("SUAXXXX"),
            "{e}"
        );
        let kp = nkeys::KeyPair::new_user();
        std::fs::write(&seed, kp.seed().unwrap()).unwrap();
        o.check().unwrap();
        o.credentials = Credentials::CredsFile(junk);
        assert!(matches!(
            o.check(),
            Err(ConnectError::BadFile {
                what: "credentials file",
                ..
            })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
