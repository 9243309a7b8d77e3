//! `/metrics` of every gateway, scraped while the run lasts.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::Method;

use super::{AddressBook, Node, Report, Sample, vitals};
use crate::gateway::Client;

/// The last `/metrics` of one incarnation of one gateway.
#[derive(Clone, Debug, Default)]
pub(super) struct Scrape {
    pub(super) rebuilds: u64,
    /// The largest clock offset the gateway reported, either way (seconds).
    pub(super) max_clock_offset_s: f64,
    pub(super) probes: BTreeMap<String, u64>,
    pub(super) unavailable: u64,
    /// Requests shed for want of room, the most bytes requests held at a
    /// scrape, and the limit on them (`--max-held-mb`).
    pub(super) shed: u64,
    pub(super) max_held: u64,
    pub(super) held_limit: u64,
    pub(super) samples: Vec<Sample>,
}

pub(super) async fn scrape_loop(
    book: AddressBook,
    scraped: Arc<Mutex<HashMap<(usize, u32), Scrape>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    t0: Instant,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        scrape_all(&book, &scraped, t0).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(super) async fn scrape_all(book: &AddressBook, scraped: &Mutex<HashMap<(usize, u32), Scrape>>, t0: Instant) {
    let targets: Vec<(usize, SocketAddr, u32)> =
        book.read().expect("not poisoned").iter().enumerate().filter_map(|(i, t)| t.map(|(a, n)| (i, a, n))).collect();
    for (index, addr, incarnation) in targets {
        let fetch = async {
            let mut client = Client::connect(addr).await?;
            client.send(Method::GET, "/metrics", bytes::Bytes::new(), &[]).await
        };
        let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(2), fetch).await else { continue };
        if reply.status != 200 {
            continue;
        }
        let text = reply.text();
        let mut scraped = scraped.lock().expect("not poisoned");
        let scrape = scraped.entry((index, incarnation)).or_default();
        scrape.samples.push(Sample::from_metrics(&text, t0.elapsed().as_secs_f64()));
        scrape.rebuilds = sum_series(&text, "stile_cache_instance_rebuilds");
        if let Some(offset_s) = gauge(&text, "stile_clock_offset_seconds") {
            scrape.max_clock_offset_s = scrape.max_clock_offset_s.max(offset_s.abs());
        }
        scrape.unavailable = sum_series(&text, "stile_database_unavailable_total");
        scrape.shed = sum_series(&text, "stile_requests_shed_total");
        scrape.max_held = scrape.max_held.max(sum_series(&text, "stile_held_request_bytes"));
        scrape.held_limit = sum_series(&text, "stile_held_request_bytes_limit");
        for probe in ["skipped", "narrowed", "full", "committed", "off"] {
            scrape.probes.insert(probe.to_owned(), sum_series(&text, &format!("stile_segments_total{{probe=\"{probe}\"}}")));
        }
    }
}

/// The sum of every series of a metric (or one series, given with labels).
pub(crate) fn sum_series(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = if name.ends_with('}') {
                rest.strip_prefix(' ')?
            } else if rest.starts_with('{') {
                rest.split_once("} ")?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum::<f64>() as u64
}

/// The value of a gauge without labels, sign and all.
pub(super) fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

pub(super) fn summarise_scrapes(scraped: &HashMap<(usize, u32), Scrape>, nodes: &[Node], report: &mut Report) {
    for (index, node) in nodes.iter().enumerate() {
        let mine: Vec<&Scrape> = scraped.iter().filter(|((i, _), _)| *i == index).map(|(_, s)| s).collect();
        let peak = |scrape: &Scrape, of: fn(&Sample) -> u64| scrape.samples.iter().map(of).max().unwrap_or(0);
        let suppressed = mine.iter().map(|s| peak(s, |x| x.suppressed)).max().unwrap_or(0);
        let evictions: u64 = mine.iter().map(|s| peak(s, |x| x.evictions)).sum();
        let rebuilds: u64 = mine.iter().map(|s| s.rebuilds).sum();
        let unavailable: u64 = mine.iter().map(|s| s.unavailable).sum();
        let shed: u64 = mine.iter().map(|s| s.shed).sum();
        let max_held = mine.iter().map(|s| s.max_held).max().unwrap_or(0);
        let held_limit = mine.iter().map(|s| s.held_limit).max().unwrap_or(0);
        let max_bytes = mine.iter().map(|s| peak(s, |x| x.cache_bytes)).max().unwrap_or(0);
        let clock_offset_s = mine.iter().map(|s| s.max_clock_offset_s).fold(0.0, f64::max);
        report.max_clock_offset_s = report.max_clock_offset_s.max(clock_offset_s);
        report.max_suppressed = report.max_suppressed.max(suppressed);
        report.max_evictions += evictions;
        let mut probes: BTreeMap<String, u64> = BTreeMap::new();
        for scrape in &mine {
            for (probe, n) in &scrape.probes {
                *probes.entry(probe.clone()).or_insert(0) += n;
                *report.probes.entry(probe.clone()).or_insert(0) += n;
            }
        }
        let mut incarnations: Vec<(&(usize, u32), &Scrape)> = scraped.iter().filter(|((i, _), _)| *i == index).collect();
        incarnations.sort_by_key(|(key, _)| **key);
        for ((_, incarnation), scrape) in incarnations {
            let label = format!("{} incarnation {incarnation}", node.spec.label);
            report.vitals.extend(vitals::describe(&label, &scrape.samples));
            report.samples.push(scrape.samples.clone());
        }
        let probes: Vec<String> = probes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        report.gateway_lines.push(format!(
            "{} ({}{}): {} incarnations, {} guest traps logged, {rebuilds} instance rebuilds, max {} KiB cached, max {suppressed} suppressed, {evictions} evictions, {unavailable} answered 503 for the database, {shed} shed for want of room (held up to {} of {} KiB), clock off PostgreSQL's by up to {clock_offset_s:.0} s, segments [{}]",
            node.spec.label,
            if node.spec.args.is_empty() { "defaults".to_owned() } else { node.spec.args.join(" ") },
            node.spec.clock.as_ref().map_or(String::new(), |skew| format!(", clock {:?} s", skew.offsets_s)),
            node.incarnation + 1,
            node.traps(),
            max_bytes / 1024,
            max_held / 1024,
            held_limit / 1024,
            probes.join(", ")
        ));
    }
}
