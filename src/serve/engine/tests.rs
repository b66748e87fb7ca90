//! The engine's common parts over a fake kind: rows that emit a fixed number of tokens, a
//! "state" that holds each row's tag and blocks (so a retirement that gathers the wrong rows,
//! or forgets to free some, shows).

use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// What a fake client hears.
#[derive(Debug, PartialEq)]
enum Heard {
    Token(u32),
    TimedOut,
    Refused(String),
    Answer(Vec<u32>),
}

struct FakeReply {
    tx: UnboundedSender<Heard>,
    /// Tokens it still takes (then it goes away in the middle of a step).
    takes: Arc<AtomicUsize>,
}

impl Reply for FakeReply {
    type Answer = u32;
    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
    fn timed_out(self) {
        let _ = self.tx.send(Heard::TimedOut);
    }
    fn refuse(self, message: String) {
        let _ = self.tx.send(Heard::Refused(message));
    }
    fn token(&self, token: u32) -> bool {
        let took = self
            .takes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        took.is_ok() && self.tx.send(Heard::Token(token)).is_ok()
    }
    fn answer(self, answers: Vec<u32>) {
        let _ = self.tx.send(Heard::Answer(answers));
    }
}

/// Per row: `Some((tokens, blocks))` to decode, or `None`: answered at once with 7.
struct FakeRequest {
    rows: Vec<Option<(usize, usize)>>,
    refuse: bool,
    deadline: Duration,
    reply: FakeReply,
}

struct FakePending {
    tag: u32,
    tokens: usize,
    blocks: usize,
}

struct FakeRow {
    tag: u32,
    left: usize,
    emitted: u32,
}

/// At most `per_step` rows start per step; `QUEUED`: drops from the queue count a latency.
struct Fake<const QUEUED: bool> {
    /// Per row of the "state": its tag and the blocks it holds.
    state: Vec<(u32, usize)>,
    next_tag: std::cell::Cell<u32>,
    per_step: usize,
}

impl<const QUEUED: bool> RowKind for Fake<QUEUED> {
    type Request = FakeRequest;
    type Reply = FakeReply;
    type Pending = FakePending;
    type Row = FakeRow;
    type Answer = u32;
    const LATENCY_OF_QUEUED_DROPS: bool = QUEUED;

    fn plan(&self, request: FakeRequest) -> Plan<Self> {
        let now = Instant::now();
        let rows = request.rows.iter().map(|row| match *row {
            Some((tokens, blocks)) => {
                let tag = self.next_tag.get();
                self.next_tag.set(tag + 1);
                RowPlan::Decode(FakePending {
                    tag,
                    tokens,
                    blocks,
                })
            }
            None => RowPlan::Answered(7),
        });
        Plan {
            reply: request.reply,
            arrived: now,
            deadline: now + request.deadline,
            rows: match request.refuse {
                true => Err("refused".into()),
                false => Ok(rows.collect()),
            },
        }
    }
    fn blocks(&self, pending: &FakePending) -> usize {
        pending.blocks
    }
    fn fits(&self, admitted: &[FakePending], _next: &FakePending) -> bool {
        admitted.len() < self.per_step
    }
    fn start(&mut self, admitted: Vec<FakePending>) -> (Vec<FakeRow>, usize) {
        let fed = admitted.len();
        let rows = admitted.into_iter().map(|p| {
            self.state.push((p.tag, p.blocks));
            FakeRow {
                tag: p.tag,
                left: p.tokens,
                emitted: 0,
            }
        });
        (rows.collect(), fed)
    }
    fn step(&mut self, rows: &mut [FakeRow]) -> Option<Stepped<u32>> {
        let tags: Vec<u32> = self.state.iter().map(|s| s.0).collect();
        assert_eq!(tags, rows.iter().map(|r| r.tag).collect::<Vec<_>>());
        let advances = rows.iter_mut().map(|row| {
            row.left -= 1;
            row.emitted += 1;
            let token = 100 * row.tag + row.emitted;
            match row.left {
                0 => Advance::Last(token, row.emitted),
                _ => Advance::Token(token),
            }
        });
        Some(Stepped {
            fed: 0,
            rows: advances.collect(),
        })
    }
    fn keep_rows(&mut self, kept: &[usize]) {
        self.state = kept.iter().map(|&r| self.state[r]).collect();
    }
    fn blocks_in_use(&self) -> usize {
        self.state.iter().map(|s| s.1).sum()
    }
}

fn engine<const QUEUED: bool>(max_batch: usize, pool: Option<usize>) -> Engine<Fake<QUEUED>> {
    let kind = Fake {
        state: Vec::new(),
        next_tag: std::cell::Cell::new(1),
        per_step: usize::MAX,
    };
    let limits = Limits {
        max_batch,
        pool_blocks: pool,
        max_overtakes: 0,
    };
    Engine::with_kind(kind, limits, Arc::new(Metrics::default()))
}

/// Submits a request as the HTTP layer does (counted in the queue); its receiver and the
/// counter of tokens it still takes.
fn submit<const Q: bool>(
    engine: &mut Engine<Fake<Q>>,
    rows: Vec<Option<(usize, usize)>>,
    deadline: Duration,
) -> (UnboundedReceiver<Heard>, Arc<AtomicUsize>) {
    let (tx, rx) = unbounded_channel();
    let takes = Arc::new(AtomicUsize::new(usize::MAX));
    engine.metrics.queued.fetch_add(1, Ordering::Relaxed);
    engine.submit(FakeRequest {
        rows,
        refuse: false,
        deadline,
        reply: FakeReply {
            tx,
            takes: takes.clone(),
        },
    });
    (rx, takes)
}

const LONG: Duration = Duration::from_secs(600);

fn heard(rx: &mut UnboundedReceiver<Heard>) -> Vec<Heard> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// A count of `/metrics` (`name` a whole line's name).
fn count(metrics: &Metrics, name: &str) -> String {
    let text = metrics.render();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
    line.unwrap().rsplit(' ').next().unwrap().to_string()
}

#[test]
fn admission_waits_for_blocks_in_arrival_order() {
    let mut e = engine::<false>(8, Some(10));
    let (mut a, _) = submit(&mut e, vec![Some((3, 6))], LONG);
    let (mut b, _) = submit(&mut e, vec![Some((1, 6))], LONG);
    // Would fit beside `a`, but does not overtake `b`.
    let (mut c, _) = submit(&mut e, vec![Some((1, 1))], LONG);
    assert!(e.step());
    assert_eq!((e.running(), e.waiting()), (1, 2));
    assert_eq!(e.metrics.queued.load(Ordering::Relaxed), 2);
    let g = e.metrics.gauges();
    assert_eq!(
        (
            g.running,
            g.kv_blocks_used,
            g.kv_blocks_free,
            g.kv_blocks_reserved
        ),
        (1, 6, 4, 6)
    );
    assert!(e.step());
    assert!(e.step());
    // `a` is done and its blocks are back; the others were not admitted yet.
    assert_eq!(heard(&mut a).last(), Some(&Heard::Answer(vec![3])));
    assert_eq!((e.running(), e.blocks_in_use(), e.reserved), (0, 0, 0));
    // Now both fit (6 + 1 blocks).
    assert!(e.step());
    assert_eq!(heard(&mut b), [Heard::Token(201), Heard::Answer(vec![1])]);
    assert_eq!(heard(&mut c), [Heard::Token(301), Heard::Answer(vec![1])]);
    assert!(!e.step());
    assert!(e.is_idle());
    assert_eq!(count(&e.metrics, "transformer_prompt_tokens_total"), "3");
    assert_eq!(count(&e.metrics, "transformer_generated_tokens_total"), "5");
    assert_eq!(count(&e.metrics, "transformer_engine_steps_total"), "4");
}

#[test]
fn the_batch_and_the_kinds_budget_bound_admission() {
    let mut e = engine::<false>(2, None);
    e.kind.per_step = 1;
    let receivers: Vec<_> = (0..3)
        .map(|_| submit(&mut e, vec![Some((4, 1))], LONG).0)
        .collect();
    assert!(e.step());
    assert_eq!((e.running(), e.waiting()), (1, 2), "one row per step");
    assert!(e.step());
    assert_eq!((e.running(), e.waiting()), (2, 1), "two rows at most");
    // No pool: nothing is free.
    let g = e.metrics.gauges();
    assert_eq!(
        (g.kv_blocks_used, g.kv_blocks_free, g.kv_blocks_reserved),
        (2, 0, 2)
    );
    while e.step() {}
    for mut rx in receivers {
        assert_eq!(heard(&mut rx).last(), Some(&Heard::Answer(vec![4])));
    }
}

#[test]
fn retired_rows_return_their_blocks_and_the_others_keep_their_state() {
    let mut e = engine::<false>(8, Some(100));
    // Rows of 1, 4, 2 and 3 tokens: they leave from the middle of the batch.
    let lens = [1, 4, 2, 3];
    let mut receivers: Vec<_> = lens
        .iter()
        .map(|&n| submit(&mut e, vec![Some((n, n * 10))], LONG).0)
        .collect();
    let mut steps = 0;
    // The fake's step checks that every row still sits on its own state row.
    while e.step() {
        steps += 1;
        let live: usize = lens.iter().filter(|&&n| n > steps).map(|n| n * 10).sum();
        assert_eq!(e.blocks_in_use(), live);
        assert_eq!(e.reserved, live);
        assert_eq!(e.metrics.gauges().kv_blocks_used, live);
    }
    assert_eq!(steps, 4);
    for (rx, &n) in receivers.iter_mut().zip(&lens) {
        let got = heard(rx);
        assert_eq!(got.len(), n + 1);
        assert_eq!(got.last(), Some(&Heard::Answer(vec![n as u32])));
    }
    let g = e.metrics.gauges();
    assert_eq!(
        (g.running, g.kv_blocks_used, g.kv_blocks_reserved),
        (0, 0, 0)
    );
    assert_eq!(g.kv_blocks_free, 100);
    for name in [
        "transformer_queue_time_seconds_count",
        "transformer_ttft_seconds_count",
        "transformer_e2e_latency_seconds_count",
    ] {
        assert_eq!(count(&e.metrics, name), "4", "{name}");
    }
    // Requests of more than one token: (end - first) / (n - 1).
    assert_eq!(
        count(
            &e.metrics,
            "transformer_time_per_output_token_seconds_count"
        ),
        "3"
    );
}

#[test]
fn clients_gone_or_late_leave_queued_or_running() {
    // The running one that went away and the one answered count an end-to-end latency; the
    // queued drops (the one gone, the late one) only where the kind says so.
    for (metrics, e2e) in [
        (gone_or_late::<false>(), "2"),
        (gone_or_late::<true>(), "4"),
    ] {
        let name = "transformer_e2e_latency_seconds_count";
        assert_eq!(count(&metrics, name), e2e);
        assert_eq!(metrics.queued.load(Ordering::Relaxed), 0);
    }
}

/// A batch of two: one running client and one waiting go away after a step, one request is
/// late from the start.
fn gone_or_late<const Q: bool>() -> Arc<Metrics> {
    let mut e = engine::<Q>(2, Some(100));
    let mut running = submit(&mut e, vec![Some((50, 5))], LONG).0;
    let mut stays = submit(&mut e, vec![Some((3, 5))], LONG).0;
    let mut waiting = submit(&mut e, vec![Some((3, 5))], LONG).0;
    let mut late = submit(&mut e, vec![Some((3, 5))], Duration::ZERO).0;
    assert!(e.step());
    // The late one left the queue at once; the batch holds two.
    assert_eq!(heard(&mut late), [Heard::TimedOut]);
    assert_eq!((e.running(), e.waiting()), (2, 1));
    assert_eq!(e.metrics.queued.load(Ordering::Relaxed), 1);
    assert_eq!(e.blocks_in_use(), 10);
    running.close();
    waiting.close();
    assert!(e.step());
    assert_eq!((e.running(), e.waiting()), (1, 0));
    assert_eq!((e.blocks_in_use(), e.reserved), (5, 5));
    assert_eq!(e.metrics.gauges().running, 1);
    while e.step() {}
    assert_eq!((e.blocks_in_use(), e.reserved), (0, 0));
    assert_eq!(heard(&mut stays).last(), Some(&Heard::Answer(vec![3])));
    assert!(heard(&mut running)
        .iter()
        .all(|h| matches!(h, Heard::Token(_))));
    e.metrics.clone()
}

#[test]
fn a_client_gone_during_a_step_leaves_at_once() {
    let mut e = engine::<false>(8, Some(100));
    let (mut gone, takes) = submit(&mut e, vec![Some((9, 4)), Some((9, 4))], LONG);
    let (mut stays, _) = submit(&mut e, vec![Some((3, 4))], LONG);
    takes.store(3, Ordering::Relaxed);
    assert!(e.step());
    assert_eq!(e.running(), 3);
    // Its row 0 takes one more token, row 1 finds it gone: both rows leave in this step.
    assert!(e.step());
    assert_eq!((e.running(), e.blocks_in_use(), e.reserved), (1, 4, 4));
    assert_eq!(heard(&mut gone).len(), 3);
    while e.step() {}
    assert_eq!(heard(&mut stays).last(), Some(&Heard::Answer(vec![3])));
    assert_eq!(
        count(&e.metrics, "transformer_e2e_latency_seconds_count"),
        "2"
    );
}

#[test]
fn a_request_of_many_rows_is_answered_once_all_are_done() {
    let mut e = engine::<false>(8, None);
    let (mut rx, _) = submit(&mut e, vec![Some((3, 1)), None, Some((1, 1))], LONG);
    assert!(e.step());
    assert_eq!(heard(&mut rx), [Heard::Token(101), Heard::Token(201)]);
    assert_eq!(e.running(), 1);
    assert!(e.step());
    assert!(e.step());
    assert_eq!(
        heard(&mut rx),
        [
            Heard::Token(102),
            Heard::Token(103),
            Heard::Answer(vec![3, 7, 1])
        ]
    );
    // One request: one first token, and its steps (3) give the time per output token.
    assert_eq!(count(&e.metrics, "transformer_ttft_seconds_count"), "1");
    let name = "transformer_time_per_output_token_seconds_count";
    assert_eq!(count(&e.metrics, name), "1");
}

#[test]
fn refused_or_fully_answered_requests_are_answered_at_submission() {
    let mut e = engine::<false>(8, None);
    let (tx, mut refused) = unbounded_channel();
    e.metrics.queued.fetch_add(1, Ordering::Relaxed);
    e.submit(FakeRequest {
        rows: vec![Some((1, 1))],
        refuse: true,
        deadline: LONG,
        reply: FakeReply {
            tx,
            takes: Arc::new(AtomicUsize::new(0)),
        },
    });
    assert_eq!(heard(&mut refused), [Heard::Refused("refused".into())]);
    let (mut answered, _) = submit(&mut e, vec![None, None], LONG);
    assert_eq!(heard(&mut answered), [Heard::Answer(vec![7, 7])]);
    assert!(e.is_idle());
    assert!(!e.step());
    assert_eq!(e.metrics.queued.load(Ordering::Relaxed), 0);
    assert_eq!(
        count(&e.metrics, "transformer_queue_time_seconds_count"),
        "1"
    );
    assert_eq!(
        count(&e.metrics, "transformer_e2e_latency_seconds_count"),
        "1"
    );
}

/// Fair admission: small requests go ahead of a large one waiting for blocks, at most
/// `max_overtakes` of them; then nothing passes it, it runs as soon as its blocks are back, and
/// the small ones after it still finish.
#[test]
fn small_requests_overtake_a_waiting_large_one_a_bounded_number_of_times() {
    let mut e = engine::<false>(8, Some(10));
    e.limits.max_overtakes = 2;
    let (mut running, _) = submit(&mut e, vec![Some((4, 6))], LONG);
    let (mut large, _) = submit(&mut e, vec![Some((1, 6))], LONG);
    let mut small: Vec<_> = (0..4)
        .map(|_| submit(&mut e, vec![Some((1, 1))], LONG).0)
        .collect();
    assert!(e.step());
    // Two small ones went ahead of the large one (6 + 6 > 10 blocks) and are done already.
    assert_eq!((e.running(), e.waiting()), (1, 3));
    for rx in &mut small[..2] {
        assert!(matches!(heard(rx).last(), Some(Heard::Answer(_))));
    }
    // Its turn: the other small ones fit but wait behind it.
    for left in [1, 1, 0] {
        assert!(e.step());
        assert_eq!((e.running(), e.waiting()), (left, 3));
        assert!(heard(&mut small[2]).is_empty());
    }
    assert_eq!(heard(&mut running).last(), Some(&Heard::Answer(vec![4])));
    // The blocks are back: the large one first, the small ones beside it.
    assert!(e.step());
    assert_eq!(heard(&mut large).last(), Some(&Heard::Answer(vec![1])));
    for rx in &mut small[2..] {
        assert!(matches!(heard(rx).last(), Some(Heard::Answer(_))));
    }
    assert!(e.is_idle());
}

/// Neither starves under a steady stream of small requests: with strict first come, first
/// served the small ones behind the large one wait for all of it; with overtaking they run
/// beside, and the large one still starts within `max_overtakes` admissions of its arrival.
#[test]
fn no_request_starves_under_a_stream_of_small_ones() {
    for max_overtakes in [0, 3] {
        let mut e = engine::<false>(8, Some(10));
        e.limits.max_overtakes = max_overtakes;
        let (mut first, _) = submit(&mut e, vec![Some((6, 6))], LONG);
        let (mut large, _) = submit(&mut e, vec![Some((3, 6))], LONG);
        let mut small = Vec::new();
        let answered =
            |rx: &mut UnboundedReceiver<Heard>| matches!(heard(rx).last(), Some(Heard::Answer(_)));
        // Small ones answered while the large one waited (the first one running).
        let (mut large_done, mut first_done, mut small_done) = (None, false, 0);
        for step in 0..40 {
            small.push(submit(&mut e, vec![Some((2, 1))], LONG).0);
            assert!(e.step());
            if large_done.is_none() && answered(&mut large) {
                large_done = Some(step);
            }
            let done_now: usize = small.iter_mut().map(|rx| answered(rx) as usize).sum();
            if !first_done {
                small_done += done_now;
            }
            first_done = first_done || answered(&mut first);
        }
        while e.step() {}
        assert!(first_done);
        // The large one waits for the first one's blocks (6 steps), then runs 3.
        let done = large_done.expect("the large request finished");
        assert!(
            done <= 9,
            "{max_overtakes}: the large one finished at step {done}"
        );
        match max_overtakes {
            0 => assert_eq!(small_done, 0),
            _ => assert!((1..=max_overtakes).contains(&small_done), "{small_done}"),
        }
        for rx in &mut small {
            heard(rx);
        }
        assert!(e.is_idle());
    }
}
