//! A far PostgreSQL on loopback: relays TCP connections to the server the
//! PG* variables (or `STILE_TEST_DATABASE_URL`) name, adding a round trip
//! of `--rtt-ms` (half each way; `stile_tests::proxy`), until stopped.
//! Prints `listening on 127.0.0.1:PORT` once it accepts connections.
//!
//! ```text
//! target/release/delay_proxy --rtt-ms 20 &
//! pgbench -h 127.0.0.1 -p PORT ...
//! ```

use std::time::Duration;

use clap::Parser;
use stile_bench::seconds;
use stile_tests::pg::admin_config;
use stile_tests::proxy::{FaultProxy, Upstream};

#[derive(Debug, Parser)]
#[command(name = "delay_proxy", about = "A userspace proxy in front of PostgreSQL that adds a round trip")]
struct Args {
    /// The round trip added, in milliseconds.
    #[arg(long, value_parser = seconds)]
    rtt_ms: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args = Args::parse();
    let upstream = Upstream::of_postgres(&admin_config().pg).await.expect("PostgreSQL's address");
    let proxy = FaultProxy::start(upstream).await.expect("listen on loopback");
    proxy.update(|toxics| toxics.latency = Duration::from_secs_f64(args.rtt_ms / 1000.0) / 2);
    println!("listening on {}", proxy.addr());
    let _ = tokio::signal::ctrl_c().await;
}
