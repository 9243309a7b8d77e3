//! PostgreSQL alone, or Redis in front of PostgreSQL, deduplicating pushes
//! as a team would write it, over the gateway's HTTP stack: the peers the
//! `peers` benchmark starts beside stile (`stile_bench::peer_http`).
//!
//! ```text
//! target/release/peer_endpoint --design postgres --database-url URL [--listen 127.0.0.1:0]
//! target/release/peer_endpoint --design redis-postgres --database-url URL --redis-url redis://127.0.0.1:6380/
//! ```

use std::net::SocketAddr;

use clap::Parser;
use stile_bench::count;
use stile_bench::peer_http::{Design, EndpointConfig, serve};

#[derive(Debug, Parser)]
#[command(name = "peer_endpoint", about = "Deduplication as a team would write it without stile, over HTTP")]
struct Args {
    #[arg(long, value_enum)]
    design: Design,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The benchmark database, whose table the design's schema holds (`peers` creates it).
    #[arg(long)]
    database_url: String,
    /// Redis, for the redis-postgres design.
    #[arg(long)]
    redis_url: Option<String>,
    /// Connections of the PostgreSQL pool.
    #[arg(long, default_value = "16", value_parser = count::<usize>)]
    pool_size: usize,
    /// The window: the Redis keys' time to live, in seconds.
    #[arg(long, default_value = "3600", value_parser = count::<u64>)]
    window_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    serve(EndpointConfig {
        design: args.design,
        listen: args.listen,
        database_url: args.database_url,
        redis_url: args.redis_url,
        pool_size: args.pool_size,
        window_seconds: args.window_seconds,
    })
    .await
}
