//! Queen's Python client (`queen-mq` 2.6.0 from PyPI), unchanged, against a
//! gateway: `kv.once`, the KV surface, a transaction with `once` and a push,
//! and timers (`tests/queen/test_queen_client.py`), over HTTP and over HTTPS.
//!
//! The client is installed into `target/queen-venv` on first run (pip, from
//! `tests/queen/requirements.txt`); `STILE_QUEEN_PYTHON` names an interpreter
//! that already has it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use stile_tests::gateway::{Gateway, GatewayOptions, fresh_database};
use stile_tests::tls_pki::{Authority, ServerFiles};

/// The interpreter that has the client, installed once per test binary: the
/// tests run at once, and two `venv`s or `pip`s into one folder collide.
fn python() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED.get_or_init(install).clone()
}

fn install() -> PathBuf {
    if let Some(python) = std::env::var_os("STILE_QUEEN_PYTHON") {
        return PathBuf::from(python);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let venv = root.join("target/queen-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let made = Command::new("python3").arg("-m").arg("venv").arg(&venv).status().expect("run python3 -m venv");
        assert!(made.success(), "python3 -m venv {} failed", venv.display());
    }
    let requirements = root.join("tests/queen/requirements.txt");
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&requirements)
        .status()
        .expect("run pip");
    assert!(installed.success(), "pip install -r {} failed", requirements.display());
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queens_python_client_drives_once_transactions_and_timers_unchanged() {
    let python = tokio::task::spawn_blocking(python).await.expect("install the client");
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    run_checks(python, format!("http://{}", gw.addr()), None, &gw).await;
}

/// The same checks over HTTPS: the client unchanged, trusting the test's
/// authority through `SSL_CERT_FILE` (httpx reads it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queens_python_client_works_unchanged_over_https() {
    let python = tokio::task::spawn_blocking(python).await.expect("install the client");
    let t = fresh_database().await;
    let files =
        ServerFiles::write(&Authority::new("stile queen https test authority"), "queen-https", &["localhost", "127.0.0.1"]);
    let gw =
        Gateway::start_with(&t.url(), &GatewayOptions { extra_args: files.gateway_args(), ..GatewayOptions::default() }).await;
    run_checks(python, format!("https://127.0.0.1:{}", gw.addr().port()), Some(files.ca.clone()), &gw).await;
}

/// Runs the client's script against `url`, trusting `ca` when given.
async fn run_checks(python: PathBuf, url: String, ca: Option<PathBuf>, gw: &Gateway) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("queen/test_queen_client.py");
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(&python);
        command.arg(&script).arg(&url);
        if let Some(ca) = ca {
            command.env("SSL_CERT_FILE", ca);
        }
        command.output()
    })
    .await
    .expect("the client's thread")
    .expect("run the client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client's checks failed ({}):\n{stdout}\n{stderr}\ngateway:\n{}",
        output.status,
        gw.logs()
    );
    assert!(stdout.contains("every check passed"), "{stdout}\n{stderr}");
}
