//! HTTPS and HTTP/2 on the listener, against a real gateway process: a
//! certificate made by the test's own authority, HTTP/2 and HTTP/1.1 chosen
//! by ALPN, HTTP/2 with prior knowledge on the plain listener, a stalled
//! handshake closed like a stalled header, HTTP/2 streams that never end cut
//! at shutdown, files that cannot serve refused at start, and the warning
//! about a bearer token sent in clear.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Frame;
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};
use stile_tests::gateway::{Answer, Gateway, GatewayOptions, fresh_database, item};
use stile_tests::tls_pki::{Authority, ServerFiles};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A certificate authority and the gateway's certificate from it, written
/// where the gateway can read them.
struct Pki {
    authority: Authority,
    files: ServerFiles,
}

impl Pki {
    fn new(test: &str) -> Pki {
        let authority = Authority::new("stile https test authority");
        let files = ServerFiles::write(&authority, &format!("https-{test}"), &["localhost", "127.0.0.1"]);
        Pki { authority, files }
    }

    fn cert(&self) -> PathBuf {
        self.files.cert.clone()
    }

    fn key(&self) -> PathBuf {
        self.files.key.clone()
    }

    fn options(&self) -> GatewayOptions {
        GatewayOptions { extra_args: self.files.gateway_args(), ..GatewayOptions::default() }
    }

    /// A client that trusts this authority only, offering `alpn`.
    fn connector(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        let ca = rustls::pki_types::CertificateDer::from_pem_slice(self.authority.cert_pem().as_bytes()).expect("the CA in PEM");
        roots.add(ca).expect("a usable CA");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }

    async fn connect(&self, addr: SocketAddr, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(addr).await.expect("connect to the gateway");
        let name = ServerName::try_from("localhost").expect("a server name");
        self.connector(alpn).connect(name, tcp).await.expect("the TLS handshake")
    }
}

fn tls_args(cert: &Path, key: &Path) -> Vec<String> {
    vec!["--tls-cert".into(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()]
}

/// A request body that is sent a frame at a time, and may never end.
type Unfinished = http_body_util::StreamBody<futures::channel::mpsc::Receiver<Result<Frame<Bytes>, std::convert::Infallible>>>;

/// One exchange on an HTTP/2 connection.
type H2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;
/// One exchange on an HTTP/1.1 connection.
type H1 = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn h2<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> H2 {
    h2_of(io).await
}

async fn h2_of<B, T>(io: T) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await.expect("the HTTP/2 handshake");
    tokio::spawn(connection);
    sender
}

async fn h1<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> H1 {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.expect("the HTTP/1.1 handshake");
    tokio::spawn(connection);
    sender
}

fn push_request(scheme: &str, addr: SocketAddr, items: Vec<Value>) -> Request<Full<Bytes>> {
    Request::post(format!("{scheme}://{addr}/api/v1/push"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json!({ "items": items }).to_string())))
        .expect("a request")
}

/// The status, version and answers of a push's response.
async fn answers(response: Response<hyper::body::Incoming>) -> (u16, Version, Vec<Answer>) {
    let (status, version) = (response.status().as_u16(), response.version());
    let body = response.into_body().collect().await.expect("the answer's body").to_bytes();
    let value: Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
    let answers = value.as_array().map(|all| all.iter().map(Answer::from_json).collect()).unwrap_or_default();
    (status, version, answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_http2_and_http11_as_alpn_chooses_with_the_same_verdicts() {
    let t = fresh_database().await;
    let pki = Pki::new("alpn");
    let gw = Gateway::start_with(&t.url(), &pki.options()).await;
    assert!(gw.logs().contains(&format!("listening on https://{}", gw.addr())), "{}", gw.logs());

    let tls = pki.connect(gw.addr(), &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "HTTP/2 is preferred");
    let mut sender = h2(tls).await;
    let first = item("orders", "p-1", Some("order-1"), json!({"n": 1}));
    let (status, version, stored) =
        answers(sender.send_request(push_request("https", gw.addr(), vec![first.clone()])).await.unwrap()).await;
    assert_eq!((status, version, stored[0].status.as_str()), (201, Version::HTTP_2, "queued"));

    let tls = pki.connect(gw.addr(), &[b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut sender = h1(tls).await;
    let (status, version, again) =
        answers(sender.send_request(push_request("https", gw.addr(), vec![first.clone()])).await.unwrap()).await;
    assert_eq!((status, version, again[0].status.as_str()), (201, Version::HTTP_11, "duplicate"));
    assert_eq!((&again[0].message_id, again[0].offset), (&stored[0].message_id, stored[0].offset));

    // A client that offers no protocol gets HTTP/1.1.
    let tls = pki.connect(gw.addr(), &[]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    let mut sender = h1(tls).await;
    let (status, _, again) = answers(sender.send_request(push_request("https", gw.addr(), vec![first])).await.unwrap()).await;
    assert_eq!((status, again[0].status.as_str()), (201, "duplicate"));

    // Plain HTTP on the TLS listener is not served.
    let mut plain = TcpStream::connect(gw.addr()).await.unwrap();
    plain.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut reply)).await.expect("the gateway closes it");
    assert!(!String::from_utf8_lossy(&reply).contains("200 OK"), "no plain answer on the TLS listener");
    assert!(!gw.logs().contains(pki.files.issued.key_pem.lines().nth(1).expect("a key line")), "the key is never printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_listener_serves_http2_by_prior_knowledge_many_streams_on_one_connection() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let sender = h2(tcp).await;
    let push_all = |round: &'static str| {
        let pushes = (0..64).map(|n| {
            let mut sender = sender.clone();
            let request = push_request(
                "http",
                gw.addr(),
                vec![item("orders", &format!("p-{}", n % 4), Some(&format!("order-{n}")), json!(n))],
            );
            async move {
                let (status, version, answers) = answers(sender.send_request(request).await.expect("an answer")).await;
                assert_eq!((status, version), (201, Version::HTTP_2), "{round}");
                answers.into_iter().next().expect("one answer")
            }
        });
        futures::future::join_all(pushes)
    };
    let first = push_all("first").await;
    assert!(first.iter().all(|answer| answer.status == "queued"), "{first:?}");
    let again = push_all("again").await;
    for (first, again) in first.iter().zip(&again) {
        assert_eq!((again.status.as_str(), &again.message_id, again.offset), ("duplicate", &first.message_id, first.offset));
    }
    // HTTP/1.1 on the same listener, as before.
    let mut client = gw.client().await;
    let answer = client.push(vec![item("orders", "p-0", Some("order-0"), json!(0))]).await;
    assert_eq!((answer[0].status.as_str(), &answer[0].message_id), ("duplicate", &first[0].message_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_handshake_is_closed_within_the_header_limit_and_others_are_served() {
    let t = fresh_database().await;
    let pki = Pki::new("stall");
    let mut options = pki.options();
    options.extra_args.extend(["--header-timeout".to_owned(), "1".to_owned()]);
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut silent = TcpStream::connect(gw.addr()).await.unwrap();
    let mut partial = TcpStream::connect(gw.addr()).await.unwrap();
    // The first bytes of a ClientHello's record, and no more.
    partial.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await.unwrap();

    let tls = pki.connect(gw.addr(), &[b"h2"]).await;
    let mut sender = h2(tls).await;
    let request = push_request("https", gw.addr(), vec![item("q", "p", Some("served"), json!(1))]);
    let (status, _, _) = answers(sender.send_request(request).await.unwrap()).await;
    assert_eq!(status, 201, "a handshake in progress elsewhere holds no one up");

    for stream in [&mut silent, &mut partial] {
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "a stalled handshake is closed by the header limit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_http2_streams_whose_bodies_never_arrive() {
    let t = fresh_database().await;
    let options = GatewayOptions {
        extra_args: ["--shutdown-timeout", "1", "--body-timeout", "600"].map(str::to_owned).to_vec(),
        ..GatewayOptions::default()
    };
    let mut gw = Gateway::start_with(&t.url(), &options).await;
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let sender = h2_of::<Unfinished, _>(tcp).await;
    let mut open = Vec::new();
    for n in 0..8 {
        let mut sender = sender.clone();
        let (mut body, frames) = futures::channel::mpsc::channel(1);
        let request = Request::post(format!("http://{}/api/v1/push", gw.addr()))
            .header("content-type", "application/json")
            .header("content-length", "1000")
            .body(http_body_util::StreamBody::new(frames))
            .unwrap();
        body.try_send(Ok(Frame::data(Bytes::from(format!("{{\"items\":[{n}"))))).unwrap();
        open.push((body, tokio::spawn(async move { sender.send_request(request).await.map(|r| r.status()) })));
    }
    // Every stream has reached its handler once the gateway reports them.
    let mut client = gw.client().await;
    loop {
        let health = client.get("/metrics").await.text();
        if stile_tests::gateway::metric_total(&health, "stile_held_request_bytes") >= 8.0 * 3000.0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    drop(client);
    gw.process().terminate();
    let status = gw.process().wait_exit(Duration::from_secs(1 + 5)).await;
    assert!(status.success(), "{status:?}\n{}", gw.logs());
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_cannot_serve_stop_the_gateway_naming_them_and_never_the_key() {
    let t = fresh_database().await;
    let pki = Pki::new("refused");
    let missing = pki.files.dir.join("absent.pem");
    let refused =
        Gateway::refused(&t.url(), &GatewayOptions { extra_args: tls_args(&missing, &pki.key()), ..GatewayOptions::default() })
            .await;
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("--tls-cert") && refused.stderr.contains("absent.pem"), "{}", refused.stderr);

    let other = pki.authority.server(&["localhost"]);
    let wrong_key = pki.files.dir.join("other-key.pem");
    std::fs::write(&wrong_key, &other.key_pem).unwrap();
    let refused = Gateway::refused(
        &t.url(),
        &GatewayOptions { extra_args: tls_args(&pki.cert(), &wrong_key), ..GatewayOptions::default() },
    )
    .await;
    assert!(refused.stderr.contains("does not match"), "{}", refused.stderr);
    let key_line = other.key_pem.lines().nth(1).expect("a key line");
    assert!(!refused.stderr.contains(key_line), "the key is never printed: {}", refused.stderr);

    let only_one = Gateway::refused(
        &t.url(),
        &GatewayOptions { extra_args: vec!["--tls-cert".into(), pki.cert().display().to_string()], ..GatewayOptions::default() },
    )
    .await;
    assert!(only_one.stderr.contains("--tls-key"), "{}", only_one.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_on_a_plain_listener_beyond_loopback_is_warned_about() {
    let t = fresh_database().await;
    let beyond =
        GatewayOptions { bearer_token: Some("s3cret".into()), listen: Some("0.0.0.0:0".into()), ..GatewayOptions::default() };
    let gw = Gateway::start_with(&t.url(), &beyond).await;
    assert!(gw.logs().contains("bearer token") && gw.logs().contains("in clear"), "{}", gw.logs());
    assert!(!gw.logs().contains("s3cret"), "the token is never printed");

    let pki = Pki::new("warn");
    let mut over_tls = pki.options();
    over_tls.bearer_token = Some("s3cret".into());
    over_tls.listen = Some("0.0.0.0:0".into());
    let quiet = Gateway::start_with(&t.url(), &over_tls).await;
    let loopback =
        Gateway::start_with(&t.url(), &GatewayOptions { bearer_token: Some("s3cret".into()), ..GatewayOptions::default() }).await;
    for gw in [&quiet, &loopback] {
        assert!(!gw.logs().contains("in clear"), "{}", gw.logs());
    }
}
