//! Every answer held against the truth: one function per property, each
//! adding what breaks it to the run's violations.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use uuid::Uuid;

use super::overload::is_shed;
use super::truth::{Copy, Stored};
use super::vitals::Latency;
use super::{CLOCK_TOLERANCE_US, Kind, Outcome, Report, Request, Status, Violation, Windows};

pub(super) type Key = (String, String);

pub(super) fn check(requests: &[Request], stored: &Stored, windows: &Windows, report: &mut Report) {
    let mut violations = Violations::default();
    count(requests, report, &mut violations);
    for (partition, what) in &stored.problems {
        violations.add("storage", partition, "-", what.clone());
    }
    let index = Index::of(requests, stored, report);
    every_copy_was_written_by_an_attempt_that_carried_it(stored, &index, &mut violations);
    let queued = every_answer_names_what_is_stored(requests, &index, windows, &mut violations);
    at_most_one_copy_inside_the_window(&index, windows, report, &mut violations);
    no_id_answered_queued_twice_inside_the_window(&queued, &index, windows, &mut violations);
    report.histories = histories(&violations.0, requests, &index);
    report.violations = violations.0;
}

/// The violations found so far.
#[derive(Default)]
struct Violations(Vec<Violation>);

impl Violations {
    fn add(&mut self, kind: &'static str, partition: &str, txn: &str, detail: String) {
        self.0.push(Violation { kind, partition: partition.to_owned(), txn: txn.to_owned(), detail });
    }
}

/// The stored copies, looked up three ways.
struct Index<'a> {
    by_request: HashMap<(usize, u64), &'a Request>,
    at_offset: HashMap<(&'a str, i64), &'a Copy>,
    copies_of: HashMap<Key, Vec<&'a Copy>>,
}

impl<'a> Index<'a> {
    fn of(requests: &'a [Request], stored: &'a Stored, report: &mut Report) -> Index<'a> {
        let by_request = requests.iter().map(|r| ((r.producer, r.seq), r)).collect();
        let mut at_offset = HashMap::new();
        let mut copies_of: HashMap<Key, Vec<&Copy>> = HashMap::new();
        for (partition, copies) in &stored.partitions {
            report.stored_partitions += 1;
            for copy in copies {
                report.stored_messages += 1;
                at_offset.insert((partition.as_str(), copy.offset), copy);
                copies_of.entry((partition.clone(), copy.txn.clone())).or_default().push(copy);
            }
        }
        report.ids_stored = copies_of.len() as u64;
        Index { by_request, at_offset, copies_of }
    }

    /// The smallest window that may have been in force while the attempt
    /// that wrote `copy` ran: its push read the window at some instant
    /// between the attempt's sending and the copy's creation.
    fn smallest_window_us(&self, copy: &Copy, windows: &Windows) -> i64 {
        let sent_us = copy
            .writer
            .and_then(|(p, r, a)| self.by_request.get(&(p, r)).and_then(|req| req.attempts.get(a as usize)).map(|at| at.sent_us))
            .unwrap_or(copy.created_us - 60_000_000);
        windows.range_us(sent_us.min(copy.created_us), copy.created_us).0
    }
}

/// The report's counts and latencies; an attempt answered with something
/// that is not an answer to a valid push is a protocol violation.
fn count(requests: &[Request], report: &mut Report, violations: &mut Violations) {
    let (mut latencies, mut attempt_latencies) = (Vec::new(), Vec::new());
    for request in requests {
        report.requests += 1;
        report.items += request.items.len() as u64;
        for item in &request.items {
            match item.kind {
                Kind::New => report.items_new += 1,
                Kind::Repeat => report.items_repeat += 1,
                Kind::Shared => report.items_shared += 1,
            }
        }
        report.attempts += request.attempts.len() as u64;
        report.retries += request.attempts.len().saturating_sub(1) as u64;
        report.retried_elsewhere += request.attempts.windows(2).filter(|pair| pair[0].gateway != pair[1].gateway).count() as u64;
        for attempt in &request.attempts {
            let item = &request.items[0];
            match &attempt.outcome {
                Outcome::Answered(_) => attempt_latencies.push(attempt.done_us - attempt.sent_us),
                Outcome::Status(status, body) => {
                    *report.statuses.entry(*status).or_insert(0) += 1;
                    if *status < 500 {
                        violations.add("protocol", &item.partition, &item.txn, format!("a valid push answered {status}: {body}"));
                    }
                }
                Outcome::Timeout => report.timeouts += 1,
                Outcome::Connection(_) => report.connection_errors += 1,
                Outcome::Malformed(why) => violations.add(
                    "protocol",
                    &item.partition,
                    &item.txn,
                    format!("a 201 that does not answer the request: {why}"),
                ),
            }
        }
        match request.answers() {
            Some((last, answers)) => {
                report.requests_answered += 1;
                latencies.push(last.done_us - request.attempts[0].sent_us);
                for answer in answers {
                    match answer.status {
                        Status::Queued => report.queued += 1,
                        Status::Duplicate => report.duplicate += 1,
                    }
                }
            }
            None => report.requests_given_up += 1,
        }
    }
    report.latency = Latency::of(latencies);
    report.attempt_latency = Latency::of(attempt_latencies);
}

/// Every stored message was written by an attempt that carried it, after it
/// was sent; an answered attempt said queued with its message id; an attempt
/// the gateway shed wrote nothing.
fn every_copy_was_written_by_an_attempt_that_carried_it(stored: &Stored, index: &Index<'_>, violations: &mut Violations) {
    for (partition, copies) in &stored.partitions {
        for copy in copies {
            if let Err(detail) = written_by_an_attempt_that_carried_it(partition, copy, index) {
                violations.add(detail.kind, partition, &copy.txn, detail.text);
            }
        }
    }
}

/// A violation's kind and what it says, before it is added.
struct Found {
    kind: &'static str,
    text: String,
}

fn written_by_an_attempt_that_carried_it(partition: &str, copy: &Copy, index: &Index<'_>) -> Result<(), Found> {
    let unknown = |text: String| Found { kind: "unknown-write", text };
    let Some((producer, seq, attempt_no)) = copy.writer else {
        return Err(unknown(format!("offset {}: payload {} names no attempt", copy.offset, copy.payload)));
    };
    let Some(request) = index.by_request.get(&(producer, seq)) else {
        return Err(unknown(format!("offset {}: no request p{producer} #{seq}", copy.offset)));
    };
    if !request.items.iter().any(|i| i.txn == copy.txn && i.partition == partition) {
        return Err(unknown(format!("offset {}: request p{producer} #{seq} did not carry this id here", copy.offset)));
    }
    let Some(attempt) = request.attempts.get(attempt_no as usize) else {
        return Err(unknown(format!("offset {}: request p{producer} #{seq} made no attempt {attempt_no}", copy.offset)));
    };
    if copy.created_us + CLOCK_TOLERANCE_US < attempt.sent_us {
        return Err(unknown(format!(
            "offset {}: written {} us before its attempt was sent",
            copy.offset,
            attempt.sent_us - copy.created_us
        )));
    }
    if let Outcome::Status(503, body) = &attempt.outcome
        && is_shed(body)
    {
        return Err(Found {
            kind: "written-though-shed",
            text: format!(
                "offset {} ({}) was written by p{producer} #{seq} attempt {attempt_no}, which was answered 503 for want of room, its body unread",
                copy.offset, copy.message_id
            ),
        });
    }
    if let Outcome::Answered(answers) = &attempt.outcome {
        let answered_queued = request.items.iter().zip(answers).any(|(i, a)| {
            i.txn == copy.txn && i.partition == partition && a.status == Status::Queued && a.message_id == copy.message_id
        });
        if !answered_queued {
            return Err(Found {
                kind: "stored-not-answered-queued",
                text: format!(
                    "offset {} ({}) was written by p{producer} #{seq} attempt {attempt_no}, which was answered without it",
                    copy.offset, copy.message_id
                ),
            });
        }
    }
    Ok(())
}

/// Every answer names a stored copy of its id, written before the answer;
/// a `queued` one was written by this request, a `duplicate` one inside the
/// window and the first such copy. Answers the ids answered `queued`, with
/// their offsets and message ids.
fn every_answer_names_what_is_stored(
    requests: &[Request],
    index: &Index<'_>,
    windows: &Windows,
    violations: &mut Violations,
) -> HashMap<Key, Vec<(i64, Uuid)>> {
    let mut queued: HashMap<Key, Vec<(i64, Uuid)>> = HashMap::new();
    for request in requests {
        let Some((attempt, answers)) = request.answers() else { continue };
        for (item, answer) in request.items.iter().zip(answers) {
            let (partition, txn) = (item.partition.as_str(), item.txn.as_str());
            let mut violate = |kind: &'static str, detail: String| violations.add(kind, partition, txn, detail);
            let Some(copy) = index.at_offset.get(&(partition, answer.offset)) else {
                violate(
                    "answer-not-stored",
                    format!("answered {:?} at offset {}, which holds nothing", answer.status, answer.offset),
                );
                continue;
            };
            if copy.txn != item.txn || copy.message_id != answer.message_id {
                violate(
                    "answer-not-stored",
                    format!(
                        "answered {:?} ({}) at offset {}, which holds {} ({})",
                        answer.status, answer.message_id, answer.offset, copy.txn, copy.message_id
                    ),
                );
                continue;
            }
            if copy.created_us > attempt.done_us + CLOCK_TOLERANCE_US {
                violate("answer-not-stored", format!("offset {} was written after the answer", answer.offset));
            }
            match answer.status {
                Status::Queued => {
                    if copy.created_us + CLOCK_TOLERANCE_US < attempt.sent_us {
                        violate(
                            "queued-but-old",
                            format!("answered queued at offset {}, written before the request was sent", answer.offset),
                        );
                    }
                    queued
                        .entry((item.partition.clone(), item.txn.clone()))
                        .or_default()
                        .push((answer.offset, answer.message_id));
                }
                Status::Duplicate => {
                    let (w_min, w_max) = windows.range_us(attempt.sent_us, attempt.done_us);
                    if copy.created_us + w_max + CLOCK_TOLERANCE_US < attempt.sent_us {
                        violate(
                            "duplicate-outside-window",
                            format!("answered duplicate of offset {}, which was outside every window in force", answer.offset),
                        );
                    }
                    // MIN picks the original: no earlier copy was surely in the window.
                    let earlier = index
                        .copies_of
                        .get(&(item.partition.clone(), item.txn.clone()))
                        .into_iter()
                        .flatten()
                        .find(|c| c.offset < answer.offset && c.created_us >= attempt.done_us - w_min + CLOCK_TOLERANCE_US);
                    if let Some(earlier) = earlier {
                        violate(
                            "duplicate-wrong-original",
                            format!(
                                "answered duplicate of offset {}, but offset {} holds an earlier copy inside the window",
                                answer.offset, earlier.offset
                            ),
                        );
                    }
                }
            }
        }
    }
    queued
}

/// At most one stored copy of an id inside the window; copies further
/// apart are counted as legal re-stores.
fn at_most_one_copy_inside_the_window(index: &Index<'_>, windows: &Windows, report: &mut Report, violations: &mut Violations) {
    for ((partition, txn), copies) in &index.copies_of {
        for pair in copies.windows(2) {
            let (previous, next) = (pair[0], pair[1]);
            let w_min = index.smallest_window_us(next, windows);
            let apart = next.created_us - previous.created_us;
            if apart <= w_min {
                violations.add(
                    "stored-twice-in-window",
                    partition,
                    txn,
                    format!(
                        "offsets {} and {} were written {:.3} s apart, inside the window of at least {} s",
                        previous.offset,
                        next.offset,
                        apart as f64 / 1e6,
                        w_min / 1_000_000
                    ),
                );
            } else {
                report.legal_restores += 1;
            }
        }
    }
}

/// No id answered `queued` twice, with two copies, inside the window.
fn no_id_answered_queued_twice_inside_the_window(
    queued: &HashMap<Key, Vec<(i64, Uuid)>>,
    index: &Index<'_>,
    windows: &Windows,
    violations: &mut Violations,
) {
    for ((partition, txn), answers) in queued {
        let mut distinct: Vec<(i64, Uuid)> = answers.clone();
        distinct.sort();
        distinct.dedup();
        for pair in distinct.windows(2) {
            let (Some(first), Some(second)) =
                (index.at_offset.get(&(partition.as_str(), pair[0].0)), index.at_offset.get(&(partition.as_str(), pair[1].0)))
            else {
                continue; // already reported as not stored
            };
            if second.created_us - first.created_us <= index.smallest_window_us(second, windows) {
                violations.add(
                    "queued-twice",
                    partition,
                    txn,
                    format!(
                        "answered queued as {} (offset {}) and as {} (offset {}) inside the window",
                        pair[0].1, pair[0].0, pair[1].1, pair[1].0
                    ),
                );
            }
        }
    }
}

/// The histories of the first 20 ids with a violation.
fn histories(violations: &[Violation], requests: &[Request], index: &Index<'_>) -> String {
    let mut shown: HashSet<Key> = HashSet::new();
    let mut out = String::new();
    for violation in violations {
        if violation.txn == "-" || shown.len() >= 20 || !shown.insert((violation.partition.clone(), violation.txn.clone())) {
            continue;
        }
        let key = (violation.partition.clone(), violation.txn.clone());
        history(&mut out, &violation.partition, &violation.txn, requests, index.copies_of.get(&key));
    }
    out
}

/// Every attempt that carried an id, and its stored copies.
pub(super) fn history(out: &mut String, partition: &str, txn: &str, requests: &[Request], copies: Option<&Vec<&Copy>>) {
    let _ = writeln!(out, "history of {partition}/{txn}:");
    let mut lines: Vec<(i64, String)> = Vec::new();
    for request in requests {
        let positions: Vec<usize> =
            request.items.iter().enumerate().filter(|(_, i)| i.txn == txn && i.partition == partition).map(|(k, _)| k).collect();
        if positions.is_empty() {
            continue;
        }
        for (n, attempt) in request.attempts.iter().enumerate() {
            let answer = match &attempt.outcome {
                Outcome::Answered(answers) => positions
                    .iter()
                    .map(|&k| format!("item {k}: {:?} {} at {}", answers[k].status, answers[k].message_id, answers[k].offset))
                    .collect::<Vec<_>>()
                    .join("; "),
                Outcome::Status(status, body) => format!("HTTP {status} {}", body.chars().take(160).collect::<String>()),
                Outcome::Timeout => "timed out".to_owned(),
                Outcome::Connection(error) => format!("connection error: {}", error.chars().take(160).collect::<String>()),
                Outcome::Malformed(why) => format!("malformed 201: {}", why.chars().take(160).collect::<String>()),
            };
            lines.push((
                attempt.sent_us,
                format!(
                    "  attempt p{} #{} try {n} via gateway {}#{}: sent {} done {} (+{} ms): {answer}",
                    request.producer,
                    request.seq,
                    attempt.gateway,
                    attempt.incarnation,
                    attempt.sent_us,
                    attempt.done_us,
                    (attempt.done_us - attempt.sent_us) / 1000
                ),
            ));
        }
    }
    for copy in copies.into_iter().flatten() {
        lines.push((
            copy.created_us,
            format!(
                "  stored at offset {}: {} written {} payload {}",
                copy.offset, copy.message_id, copy.created_us, copy.payload
            ),
        ));
    }
    lines.sort_by_key(|(at, _)| *at);
    for (_, line) in lines {
        let _ = writeln!(out, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::checker::scrape::sum_series;
    use crate::checker::{Attempt, Item, ItemAnswer, WindowChange};

    #[test]
    fn window_ranges_cover_the_uncertain_interval() {
        let windows = Windows {
            initial: 3600,
            changes: vec![
                WindowChange { seconds: 2, sent_us: 100, acked_us: 200 },
                WindowChange { seconds: 3600, sent_us: 1_000, acked_us: 1_100 },
            ],
        };
        assert_eq!(windows.range_us(0, 50), (3_600_000_000, 3_600_000_000));
        assert_eq!(windows.range_us(0, 150), (2_000_000, 3_600_000_000));
        assert_eq!(windows.range_us(300, 400), (2_000_000, 2_000_000));
        assert_eq!(windows.range_us(300, 1_050), (2_000_000, 3_600_000_000));
        assert_eq!(windows.range_us(1_200, 1_300), (3_600_000_000, 3_600_000_000));
    }

    fn request(producer: usize, seq: u64, txn: &str, sent_us: i64, answer: Option<(Status, Uuid, i64)>) -> Request {
        let outcome = match answer {
            Some((status, message_id, offset)) => Outcome::Answered(vec![ItemAnswer { status, message_id, offset }]),
            None => Outcome::Timeout,
        };
        Request {
            producer,
            seq,
            items: vec![Item { txn: txn.to_owned(), partition: "part-0".to_owned(), kind: Kind::New }],
            attempts: vec![Attempt { gateway: 0, incarnation: 0, sent_us, done_us: sent_us + 1_000, outcome }],
        }
    }

    fn copy(offset: i64, message_id: Uuid, txn: &str, created_us: i64, writer: (usize, u64, u32)) -> Copy {
        Copy { offset, message_id, txn: txn.to_owned(), created_us, writer: Some(writer), payload: Value::Null }
    }

    fn checked(requests: &[Request], copies: Vec<Copy>, windows: &Windows) -> Report {
        let mut stored = Stored::default();
        stored.partitions.insert("part-0".to_owned(), copies);
        let mut report = Report::default();
        check(requests, &stored, windows, &mut report);
        report
    }

    fn kinds(report: &Report) -> Vec<&'static str> {
        report.violations_by_kind().into_keys().collect()
    }

    const S: i64 = 1_000_000;

    #[test]
    fn a_clean_history_passes_and_a_restore_after_a_short_window_is_legal() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let long = Windows { initial: 3600, changes: Vec::new() };
        let requests = [
            request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))),
            request(0, 1, "x", 20 * S, Some((Status::Duplicate, a, 0))),
        ];
        let report = checked(&requests, vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))], &long);
        assert!(report.violations.is_empty(), "{report}");
        // Stored again 10 s later while the window was 2 s: legal.
        let short = Windows { initial: 3600, changes: vec![WindowChange { seconds: 2, sent_us: 5 * S, acked_us: 5 * S + 10 }] };
        let requests =
            [request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))), request(0, 1, "x", 20 * S, Some((Status::Queued, b, 1)))];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (0, 1, 0))];
        let report = checked(&requests, copies, &short);
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.legal_restores, 1);
    }

    #[test]
    fn a_second_copy_inside_the_window_is_caught_with_its_history() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let long = Windows { initial: 3600, changes: Vec::new() };
        let requests =
            [request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))), request(1, 7, "x", 20 * S, Some((Status::Queued, b, 1)))];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (1, 7, 0))];
        let report = checked(&requests, copies, &long);
        assert_eq!(kinds(&report), ["queued-twice", "stored-twice-in-window"], "{report}");
        assert!(report.histories.contains("history of part-0/x"), "{report}");
        assert!(report.histories.contains("attempt p1 #7 try 0"), "{report}");
        // The window was lengthened back before the second push: still caught,
        // though the first copy was written under the short window.
        let changes = vec![
            WindowChange { seconds: 2, sent_us: 5 * S, acked_us: 5 * S + 10 },
            WindowChange { seconds: 3600, sent_us: 15 * S, acked_us: 15 * S + 10 },
        ];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (1, 7, 0))];
        let report = checked(&requests, copies, &Windows { initial: 3600, changes });
        assert!(kinds(&report).contains(&"stored-twice-in-window"), "{report}");
    }

    #[test]
    fn wrong_answers_are_caught() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let long = Windows { initial: 3600, changes: Vec::new() };
        // A queued answer whose offset holds another message.
        let requests = [request(0, 0, "x", 10 * S, Some((Status::Queued, b, 0)))];
        let report = checked(&requests, vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))], &long);
        assert!(kinds(&report).contains(&"answer-not-stored"), "{report}");
        assert!(kinds(&report).contains(&"stored-not-answered-queued"), "{report}");
        // A duplicate that names a later copy while an earlier one is in the window.
        let short = Windows {
            initial: 3600,
            changes: vec![
                WindowChange { seconds: 2, sent_us: 5 * S, acked_us: 5 * S + 10 },
                WindowChange { seconds: 3600, sent_us: 25 * S, acked_us: 25 * S + 10 },
            ],
        };
        let requests = [
            request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))),
            request(0, 1, "x", 20 * S, Some((Status::Queued, b, 1))),
            request(0, 2, "x", 30 * S, Some((Status::Duplicate, b, 1))),
        ];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (0, 1, 0))];
        let report = checked(&requests, copies, &short);
        assert_eq!(kinds(&report), ["duplicate-wrong-original"], "{report}");
        // A write by an attempt that never carried the id.
        let requests = [request(0, 0, "y", 10 * S, None)];
        let report = checked(&requests, vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))], &long);
        assert_eq!(kinds(&report), ["unknown-write"], "{report}");
    }

    #[test]
    fn a_write_by_a_shed_attempt_is_caught_and_one_by_a_503_for_the_database_is_not() {
        let a = Uuid::now_v7();
        let long = Windows { initial: 3600, changes: Vec::new() };
        let refused = |body: &str| {
            let mut shed = request(0, 0, "x", 10 * S, None);
            shed.attempts[0].outcome = Outcome::Status(503, body.to_owned());
            let mut retried = request(0, 0, "x", 11 * S, Some((Status::Duplicate, a, 0)));
            retried.attempts[0].done_us = 11 * S + 1_000;
            shed.attempts.push(retried.attempts.remove(0));
            shed
        };
        let written = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))];
        let shed = refused(
            r#"{"error":"body: the gateway is at capacity and its backlog would not drain within the queue time limit; retry"}"#,
        );
        let report = checked(&[shed], written.clone(), &long);
        assert_eq!(kinds(&report), ["written-though-shed"], "{report}");
        let unavailable = refused(r#"{"error":"the database is unavailable; retry"}"#);
        let report = checked(&[unavailable], written, &long);
        assert!(report.violations.is_empty(), "{report}");
    }

    #[test]
    fn sums_series() {
        let text = "# HELP x\nstile_cache_evictions{shard=\"0\"} 3\nstile_cache_evictions{shard=\"1\"} 4\nstile_segments_total{probe=\"full\"} 9\n";
        assert_eq!(sum_series(text, "stile_cache_evictions"), 7);
        assert_eq!(sum_series(text, "stile_segments_total{probe=\"full\"}"), 9);
        assert_eq!(sum_series(text, "stile_cache_suppressed_partitions"), 0);
    }
}
