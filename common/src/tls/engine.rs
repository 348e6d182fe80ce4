//! One TLS 1.3 handshake (OpenSSL), over memory buffers: the peer's records
//! go in with [`Engine::feed`] and ours come out with
//! [`Engine::take_output`]; the socket is the caller's. Once it is done,
//! its application traffic secrets key the records (`protect`, or the
//! kernel's TLS). The only `unsafe` of
//! the TLS code lives here, behind these safe methods.
//!
//! Why OpenSSL: TLS 1.3 with an *external* PSK (RFC 8446 §4.2.11, what
//! NVMe/TCP requires) is what SPDK does with OpenSSL's PSK session
//! callbacks, and what no pure-Rust TLS library offers; the `openssl` crate
//! does not bind those callbacks, so this binds them through `openssl-sys`.
//! Debian 12's OpenSSL 3.0 has them.

use super::key::{Hash, TlsPsk};
use openssl_sys as ffi;
use std::ffi::{c_int, c_uchar, c_void, CStr};
use std::ptr;
use zeroize::Zeroizing;

// Not bound by openssl-sys (OpenSSL 1.1.1 and later have them).
#[allow(non_camel_case_types)]
type SSL_psk_find_session_cb_func = Option<
    unsafe extern "C" fn(
        ssl: *mut ffi::SSL,
        identity: *const c_uchar,
        identity_len: usize,
        sess: *mut *mut ffi::SSL_SESSION,
    ) -> c_int,
>;
#[allow(non_camel_case_types)]
type SSL_psk_use_session_cb_func = Option<
    unsafe extern "C" fn(
        ssl: *mut ffi::SSL,
        md: *const ffi::EVP_MD,
        id: *mut *const c_uchar,
        idlen: *mut usize,
        sess: *mut *mut ffi::SSL_SESSION,
    ) -> c_int,
>;
extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(
        ctx: *mut ffi::SSL_CTX,
        cb: SSL_psk_find_session_cb_func,
    );
    fn SSL_CTX_set_psk_use_session_callback(
        ctx: *mut ffi::SSL_CTX,
        cb: SSL_psk_use_session_cb_func,
    );
    fn SSL_SESSION_new() -> *mut ffi::SSL_SESSION;
    fn SSL_SESSION_set1_master_key(
        sess: *mut ffi::SSL_SESSION,
        key: *const c_uchar,
        len: usize,
    ) -> c_int;
    fn SSL_SESSION_set_cipher(sess: *mut ffi::SSL_SESSION, cipher: *const ffi::SSL_CIPHER)
        -> c_int;
    fn SSL_SESSION_set_protocol_version(sess: *mut ffi::SSL_SESSION, version: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut ffi::SSL, ptr: *const c_uchar) -> *const ffi::SSL_CIPHER;
}

const BIO_CTRL_PENDING: c_int = 10;
/// The cipher suites NVMe/TCP allows (NVMe/TCP 1.1, 3.6.1.3).
const CIPHER_SUITES: &CStr = c"TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";

/// A TLS failure, with OpenSSL's reasons.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

impl TlsError {
    /// `what` failed, with the reasons OpenSSL queued (which it forgets).
    fn openssl(what: &str) -> TlsError {
        let mut reasons = Vec::new();
        loop {
            // SAFETY: reads and removes the calling thread's oldest error.
            let code = unsafe { ffi::ERR_get_error() };
            if code == 0 {
                break;
            }
            // SAFETY: a static string, or null for an unknown reason.
            let reason = unsafe { ffi::ERR_reason_error_string(code) };
            let s = if reason.is_null() {
                format!("error {code:#x}")
            } else {
                // SAFETY: OpenSSL's NUL-terminated static string.
                unsafe { CStr::from_ptr(reason) }
                    .to_string_lossy()
                    .into_owned()
            };
            reasons.push(s);
        }
        if reasons.is_empty() {
            TlsError(what.to_string())
        } else {
            TlsError(format!("{what}: {}", reasons.join("; ")))
        }
    }
}

/// How a server answers a PSK identity: the key, or why there is none.
pub type PskLookup = Box<dyn FnMut(&[u8]) -> Result<TlsPsk, String> + Send>;

/// What the callbacks reach through the SSL's application data: the PSK
/// side, and the application traffic secrets the key log gives (for kernel
/// TLS).
struct Callbacks {
    psk: Psk,
    /// CLIENT_TRAFFIC_SECRET_0 and SERVER_TRAFFIC_SECRET_0.
    client_secret: Option<Zeroizing<Vec<u8>>>,
    server_secret: Option<Zeroizing<Vec<u8>>>,
}

/// The application traffic secrets of a connection, from its own side.
pub struct Traffic {
    pub hash: Hash,
    /// The secret of what this side sends, and of what it receives.
    pub sent: Zeroizing<Vec<u8>>,
    pub received: Zeroizing<Vec<u8>>,
}

/// The PSK side of a connection.
enum Psk {
    /// A client offers this identity with this key.
    Client { identity: Vec<u8>, psk: TlsPsk },
    /// A server looks identities up; `outcome` keeps what happened to the
    /// last one offered.
    Server {
        lookup: PskLookup,
        outcome: Option<Result<String, String>>,
    },
}

/// Where a handshake is.
#[derive(Debug)]
pub enum Progress {
    Done,
    /// It needs more bytes from the peer.
    WantInput,
}

/// One TLS connection: OpenSSL's state with its input and output buffers.
pub struct Engine {
    ssl: *mut ffi::SSL,
    rbio: *mut ffi::BIO,
    wbio: *mut ffi::BIO,
    /// Reached from the callbacks through the SSL's application data; boxed
    /// so that its address stays while the engine moves.
    cb: Box<Callbacks>,
}

// SAFETY: the SSL object and its BIOs belong to this engine alone and are
// used from one thread at a time (`&mut self`); OpenSSL allows an SSL object
// to move between threads.
unsafe impl Send for Engine {}

impl Engine {
    /// A client offering `identity` with `psk`, and only the cipher suite
    /// of the PSK's hash (as SPDK's and the kernel's hosts do): a server
    /// picks its suite before it looks at the PSK, and a PSK whose hash is
    /// not the suite's is not used.
    pub fn client(identity: &str, psk: TlsPsk) -> Result<Engine, TlsError> {
        let suite = match psk.hash {
            Hash::Sha256 => c"TLS_AES_128_GCM_SHA256",
            Hash::Sha384 => c"TLS_AES_256_GCM_SHA384",
        };
        let e = Engine::new(Psk::Client {
            identity: identity.as_bytes().to_vec(),
            psk,
        })?;
        // SAFETY: a live SSL object; the suite's name is a C string.
        unsafe {
            if ffi::SSL_set_ciphersuites(e.ssl, suite.as_ptr()) != 1 {
                return Err(TlsError::openssl("choosing the cipher suite"));
            }
            ffi::SSL_set_connect_state(e.ssl);
        }
        Ok(e)
    }

    /// A server whose `lookup` turns each identity offered into its key.
    pub fn server(lookup: PskLookup) -> Result<Engine, TlsError> {
        let e = Engine::new(Psk::Server {
            lookup,
            outcome: None,
        })?;
        // SAFETY: a live SSL object.
        unsafe { ffi::SSL_set_accept_state(e.ssl) };
        Ok(e)
    }

    fn new(psk: Psk) -> Result<Engine, TlsError> {
        let server = matches!(psk, Psk::Server { .. });
        let mut cb = Box::new(Callbacks {
            psk,
            client_secret: None,
            server_secret: None,
        });
        // SAFETY: plain OpenSSL object construction; every pointer is checked
        // before use and freed on every path (the SSL holds its own
        // reference to the context, which is released here).
        unsafe {
            ffi::ERR_clear_error();
            let ctx = ffi::SSL_CTX_new(ffi::TLS_method());
            if ctx.is_null() {
                return Err(TlsError::openssl("SSL_CTX_new"));
            }
            let configured = ffi::SSL_CTX_set_min_proto_version(ctx, ffi::TLS1_3_VERSION as _)
                == 1
                && ffi::SSL_CTX_set_max_proto_version(ctx, ffi::TLS1_3_VERSION as _) == 1
                && ffi::SSL_CTX_set_ciphersuites(ctx, CIPHER_SUITES.as_ptr()) == 1
                // No session tickets: they are of no use to NVMe/TCP, and a
                // record after the handshake would keep the socket from
                // being handed to kernel TLS.
                && ffi::SSL_CTX_set_num_tickets(ctx, 0) == 1;
            if !configured {
                ffi::SSL_CTX_free(ctx);
                return Err(TlsError::openssl("configuring TLS 1.3"));
            }
            ffi::SSL_CTX_set_options(ctx, ffi::SSL_OP_NO_TICKET as _);
            ffi::SSL_CTX_set_keylog_callback(ctx, Some(key_log));
            if server {
                SSL_CTX_set_psk_find_session_callback(ctx, Some(find_session));
            } else {
                SSL_CTX_set_psk_use_session_callback(ctx, Some(use_session));
            }
            let ssl = ffi::SSL_new(ctx);
            ffi::SSL_CTX_free(ctx);
            if ssl.is_null() {
                return Err(TlsError::openssl("SSL_new"));
            }
            let rbio = ffi::BIO_new(ffi::BIO_s_mem());
            let wbio = ffi::BIO_new(ffi::BIO_s_mem());
            if rbio.is_null() || wbio.is_null() {
                for b in [rbio, wbio] {
                    if !b.is_null() {
                        ffi::BIO_free_all(b);
                    }
                }
                ffi::SSL_free(ssl);
                return Err(TlsError::openssl("BIO_new"));
            }
            ffi::SSL_set_bio(ssl, rbio, wbio);
            let data = &mut *cb as *mut Callbacks as *mut c_void;
            ffi::SSL_set_ex_data(ssl, 0, data);
            Ok(Engine {
                ssl,
                rbio,
                wbio,
                cb,
            })
        }
    }

    /// Gives the engine bytes received from the peer.
    pub fn feed(&mut self, cipher: &[u8]) {
        for chunk in cipher.chunks(i32::MAX as usize) {
            // SAFETY: a memory BIO copies `chunk`; it grows as needed, so the
            // write takes it all.
            let n =
                unsafe { ffi::BIO_write(self.rbio, chunk.as_ptr().cast(), chunk.len() as c_int) };
            debug_assert_eq!(n as usize, chunk.len());
        }
    }

    /// Bytes waiting to go to the peer.
    pub fn output_len(&self) -> usize {
        // SAFETY: a query of a live BIO.
        unsafe { ffi::BIO_ctrl(self.wbio, BIO_CTRL_PENDING, 0, ptr::null_mut()) as usize }
    }

    /// Bytes received and not yet taken by the engine (part of a record).
    pub fn input_len(&self) -> usize {
        // SAFETY: a query of a live BIO.
        unsafe { ffi::BIO_ctrl(self.rbio, BIO_CTRL_PENDING, 0, ptr::null_mut()) as usize }
    }

    /// Whether received bytes wait in the engine: part of a record, or a
    /// record's plaintext not yet read.
    pub fn buffered(&self) -> bool {
        // SAFETY: a query of a live SSL object.
        self.input_len() > 0 || unsafe { ffi::SSL_pending(self.ssl) } > 0
    }

    /// Appends the bytes waiting to go to the peer to `out`.
    pub fn take_output(&mut self, out: &mut Vec<u8>) {
        let n = self.output_len();
        if n == 0 {
            return;
        }
        let at = out.len();
        out.resize(at + n, 0);
        // SAFETY: reads at most `n` bytes into the room just made.
        let got = unsafe { ffi::BIO_read(self.wbio, out[at..].as_mut_ptr().cast(), n as c_int) };
        out.truncate(at + got.max(0) as usize);
    }

    /// Takes the handshake as far as the bytes fed allow.
    pub fn handshake(&mut self) -> Result<Progress, TlsError> {
        // SAFETY: a live SSL object; the callbacks find their data in place.
        let r = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_do_handshake(self.ssl)
        };
        if r == 1 {
            return Ok(Progress::Done);
        }
        match self.error(r) {
            ffi::SSL_ERROR_WANT_READ => Ok(Progress::WantInput),
            _ => Err(self.failure("handshake")),
        }
    }

    /// The negotiated cipher suite, once the handshake is done.
    pub fn cipher(&self) -> String {
        // SAFETY: a live SSL object; the name is a static string.
        unsafe {
            let c = ffi::SSL_get_current_cipher(self.ssl);
            if c.is_null() {
                return String::new();
            }
            CStr::from_ptr(ffi::SSL_CIPHER_get_name(c))
                .to_string_lossy()
                .into_owned()
        }
    }

    /// On a server: the identity the client offered and the key found for
    /// it, or why none was; `None` before the client offered one.
    pub fn psk_outcome(&self) -> Option<&Result<String, String>> {
        match &self.cb.psk {
            Psk::Server { outcome, .. } => outcome.as_ref(),
            Psk::Client { .. } => None,
        }
    }

    /// The application traffic secrets of a connection whose handshake is
    /// done and which has carried no record since (its records' sequence
    /// numbers start at 0).
    pub fn traffic_after_handshake(&self) -> Result<Traffic, TlsError> {
        if self.buffered() {
            return Err(TlsError(
                "records arrived with the handshake's last one".into(),
            ));
        }
        self.traffic()
            .ok_or_else(|| TlsError("the handshake's traffic secrets are not known".into()))
    }

    /// The application traffic secrets, once the handshake is done.
    pub fn traffic(&self) -> Option<Traffic> {
        let hash = if self.cipher().contains("SHA384") {
            Hash::Sha384
        } else {
            Hash::Sha256
        };
        let (client, server) = (
            self.cb.client_secret.clone()?,
            self.cb.server_secret.clone()?,
        );
        let (sent, received) = match self.cb.psk {
            Psk::Client { .. } => (client, server),
            Psk::Server { .. } => (server, client),
        };
        Some(Traffic {
            hash,
            sent,
            received,
        })
    }

    fn error(&self, r: c_int) -> c_int {
        // SAFETY: a live SSL object and the return of its last call.
        unsafe { ffi::SSL_get_error(self.ssl, r) }
    }

    /// The failure of `what`: the server's verdict on the identity when it
    /// refused one, else OpenSSL's reasons, told in NVMe's terms where the
    /// server knows more.
    fn failure(&self, what: &str) -> TlsError {
        let e = TlsError::openssl(what);
        let Psk::Server { outcome, .. } = &self.cb.psk else {
            return e;
        };
        let told = match outcome {
            Some(Err(why)) => why.clone(),
            Some(Ok(id)) if e.0.contains("binder does not verify") => format!(
                "the host's key is not the one configured for identity {id} (its PSK binder does not verify)"
            ),
            Some(Ok(id)) if e.0.contains("no suitable signature algorithm") => format!(
                "identity {id}: the cipher suite chosen is not of the key's hash (the host must offer the suite of its key)"
            ),
            None if e.0.contains("no suitable signature algorithm") || e.0.contains("no shared cipher") => {
                "the host offered no PSK identity (NVMe/TCP takes no certificates)".to_string()
            }
            _ => return e,
        };
        TlsError(format!("{what}: {told}"))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: frees the SSL object, which owns both BIOs; nothing else
        // holds them. OpenSSL cleanses the sessions' keys as it frees them.
        unsafe { ffi::SSL_free(self.ssl) };
    }
}

/// A TLS 1.3 session resuming from `psk`: how OpenSSL takes an external PSK.
///
/// # Safety
/// `ssl` is a live SSL object (in a PSK callback).
unsafe fn psk_session(ssl: *mut ffi::SSL, psk: &TlsPsk) -> *mut ffi::SSL_SESSION {
    // TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384: the suite whose
    // hash is the PSK's (RFC 8446, 4.2.11).
    let id: [u8; 2] = match psk.hash {
        Hash::Sha256 => [0x13, 0x01],
        Hash::Sha384 => [0x13, 0x02],
    };
    // SAFETY: `ssl` is live (the caller's promise); the session is freed on
    // failure, else handed to OpenSSL.
    unsafe {
        let cipher = SSL_CIPHER_find(ssl, id.as_ptr());
        let sess = SSL_SESSION_new();
        if cipher.is_null() || sess.is_null() {
            return ptr::null_mut();
        }
        let key = psk.key.as_slice();
        if SSL_SESSION_set1_master_key(sess, key.as_ptr(), key.len()) != 1
            || SSL_SESSION_set_cipher(sess, cipher) != 1
            || SSL_SESSION_set_protocol_version(sess, ffi::TLS1_3_VERSION) != 1
        {
            ffi::SSL_SESSION_free(sess);
            return ptr::null_mut();
        }
        sess
    }
}

/// The server's callback: the session of the identity offered, or none
/// (then the handshake fails: no certificate stands in for a PSK).
unsafe extern "C" fn find_session(
    ssl: *mut ffi::SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes the live SSL whose application data is the
    // engine's boxed `Psk`, the identity's bytes and the place of the
    // answer; the engine is borrowed by the call that runs this callback.
    unsafe {
        *sess = ptr::null_mut();
        let Some(Callbacks {
            psk: Psk::Server { lookup, outcome },
            ..
        }) = ffi::SSL_get_ex_data(ssl, 0).cast::<Callbacks>().as_mut()
        else {
            return 0;
        };
        let identity = std::slice::from_raw_parts(identity, identity_len);
        let shown = String::from_utf8_lossy(identity).into_owned();
        match lookup(identity) {
            Ok(psk) => {
                *sess = psk_session(ssl, &psk);
                *outcome = Some(Ok(shown));
            }
            Err(why) => *outcome = Some(Err(why)),
        }
        1
    }
}

/// The client's callback: its identity and the session of its key, when the
/// suite OpenSSL settled on (`md`, if any) has the key's hash.
unsafe extern "C" fn use_session(
    ssl: *mut ffi::SSL,
    md: *const ffi::EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: as in `find_session`; the identity's bytes live in the boxed
    // `Psk`, which outlives the handshake.
    unsafe {
        *sess = ptr::null_mut();
        let Some(Callbacks {
            psk: Psk::Client { identity, psk },
            ..
        }) = ffi::SSL_get_ex_data(ssl, 0).cast::<Callbacks>().as_ref()
        else {
            return 0;
        };
        let want = match psk.hash {
            Hash::Sha256 => ffi::EVP_sha256(),
            Hash::Sha384 => ffi::EVP_sha384(),
        };
        if !md.is_null() && ffi::EVP_MD_get_type(md) != ffi::EVP_MD_get_type(want) {
            return 1; // no PSK for that suite
        }
        let s = psk_session(ssl, psk);
        if s.is_null() {
            return 0;
        }
        *id = identity.as_ptr();
        *idlen = identity.len();
        *sess = s;
        1
    }
}

/// The key log callback: keeps the application traffic secrets (the lines
/// `CLIENT_TRAFFIC_SECRET_0 <random> <hex>` and `SERVER_...`), which kernel
/// TLS needs; ignores the other lines.
unsafe extern "C" fn key_log(ssl: *const ffi::SSL, line: *const std::ffi::c_char) {
    // SAFETY: OpenSSL passes the live SSL whose application data is the
    // engine's boxed `Callbacks` (borrowed by the call that runs this
    // callback) and a NUL-terminated line.
    unsafe {
        let Some(cb) = ffi::SSL_get_ex_data(ssl, 0).cast::<Callbacks>().as_mut() else {
            return;
        };
        let line = CStr::from_ptr(line).to_bytes();
        let mut words = line.split(|b| *b == b' ');
        let (Some(label), Some(_random), Some(hex)) = (words.next(), words.next(), words.next())
        else {
            return;
        };
        let slot = match label {
            b"CLIENT_TRAFFIC_SECRET_0" => &mut cb.client_secret,
            b"SERVER_TRAFFIC_SECRET_0" => &mut cb.server_secret,
            _ => return,
        };
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let secret: Option<Vec<u8>> = hex
            .chunks(2)
            .map(|p| Some(digit(p[0])? << 4 | digit(*p.get(1)?)?))
            .collect();
        *slot = secret.map(Zeroizing::new);
    }
}
