//! Queen's Python client (`queen-mq` 2.6.0 from PyPI), unchanged, against a
//! gateway: `kv.once`, the KV surface, a transaction with `once` and a push,
//! and timers (`tests/queen/test_queen_client.py`).
//!
//! The client is installed into `target/queen-venv` on first run (pip, from
//! `tests/queen/requirements.txt`); `STILE_QUEEN_PYTHON` names an interpreter
//! that already has it.

use std::path::{Path, PathBuf};
use std::process::Command;

use stile_tests::gateway::{Gateway, fresh_database};

fn python() -> PathBuf {
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("queen/test_queen_client.py");
    let url = format!("http://{}", gw.addr());
    let output = tokio::task::spawn_blocking(move || Command::new(&python).arg(&script).arg(&url).output())
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
