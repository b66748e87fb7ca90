//! The listener: accepts connections under a cap and closes the ones that stall, so that a
//! flood of half-open connections (slowloris) cannot take the server's file descriptors and
//! `/health` keeps answering.
//!
//! - **Header timeout**: a connection must send a whole request head within
//!   `header_timeout` of being opened, and again of finishing its previous answer (an idle
//!   keep-alive connection waits no longer than a new one); else it is closed (hyper's
//!   `header_read_timeout`, whose timer starts whenever the connection waits for a head).
//! - **Connection cap**: at most `max_connections` connections are held. A connection that
//!   arrives at the cap takes the place of the held connection that has been idle the longest
//!   (no request being answered: half-open, or keep-alive between requests), which is closed;
//!   when every held connection is answering a request, the newcomer gets a 503 and is closed.
//!   A client that sends its request as soon as it connects (a health check) therefore always
//!   gets in, whatever the number of stalled connections.
//! - **Shutdown**: the listener stops accepting; every connection finishes the request it is
//!   answering (hyper's graceful shutdown) and closes.
//!
//! A request counts as being answered from the moment its head is read until its response
//! body (a stream included) is sent or dropped (`Busy`).

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tower::ServiceExt;

/// How many connections, and how long a silent one lives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConnectionLimits {
    /// Connections held at most.
    pub max_connections: usize,
    /// Time a connection has to send a request head.
    pub header_timeout: Duration,
}

/// What the listener knows of one connection.
struct Held {
    /// Requests being answered on it.
    busy: Arc<AtomicUsize>,
    /// When it last became idle (opened, or finished an answer).
    idle_since: Arc<Mutex<Instant>>,
    /// Told when the connection is evicted.
    evict: Arc<Notify>,
}

/// The held connections, by the order they were accepted.
#[derive(Default)]
struct Table {
    held: Mutex<BTreeMap<u64, Held>>,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Held>> {
        // A panic while holding the lock leaves at worst a stale entry: keep serving.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for one more connection under `cap`: evicts the connection idle the
    /// longest when the table is full. False when every held connection is busy.
    fn make_room(&self, cap: usize) -> bool {
        let mut held = self.lock();
        if held.len() < cap {
            return true;
        }
        let oldest = held
            .iter()
            .filter(|(_, h)| h.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|(_, h)| *h.idle_since.lock().unwrap_or_else(|e| e.into_inner()))
            .map(|(&id, _)| id);
        match oldest.and_then(|id| held.remove(&id)) {
            Some(evicted) => {
                evicted.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Marks a connection busy while a request is answered: made when its head is read, dropped
/// with its response body.
struct Busy {
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
}

impl Busy {
    fn start(busy: &Arc<AtomicUsize>, idle_since: &Arc<Mutex<Instant>>) -> Self {
        busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            busy: busy.clone(),
            idle_since: idle_since.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection [`Busy`] until it is sent or dropped.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        // `Body` is Unpin, and so is `Tracked`: no pinning invariant to keep.
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The 503 a connection gets when every held connection is busy.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: 147\r\n\r\n{\"error\":{\"message\":\"too many connections (--max-connections); retry later\",\"type\":\"unavailable_error\",\"param\":null,\"code\":\"too_many_connections\"}}";

/// Serves `router` on `listener` until `shutdown` resolves, then waits for the connections'
/// requests to finish (see the module docs).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let table = Arc::new(Table::default());
    let (stop, stopping) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => {
                    // Out of file descriptors or a connection reset before it was accepted:
                    // make room and retry shortly.
                    table.make_room(table.lock().len());
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if !table.make_room(limits.max_connections.max(1)) {
            let _ = stream.try_write(FULL);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let idle_since = Arc::new(Mutex::new(Instant::now()));
        let evict = Arc::new(Notify::new());
        table.lock().insert(
            id,
            Held {
                busy: busy.clone(),
                idle_since: idle_since.clone(),
                evict: evict.clone(),
            },
        );
        let router = router.clone();
        let table = table.clone();
        let mut stopping = stopping.clone();
        tasks.spawn(async move {
            let service = {
                let busy = busy.clone();
                hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                    let guard = Busy::start(&busy, &idle_since);
                    let router = router.clone();
                    async move {
                        let response = match router.oneshot(request).await {
                            Ok(r) => r,
                            Err(never) => match never {},
                        };
                        Ok::<_, Infallible>(
                            response.map(|body| Body::new(Tracked { body, _busy: guard })),
                        )
                    }
                })
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                // Header names as llama-server writes them (`Access-Control-Allow-Origin`):
                // case does not matter to HTTP, but some clients read them into plain maps.
                .title_case_headers(true)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let mut shutting_down = false;
            loop {
                tokio::select! {
                    _ = connection.as_mut() => break,
                    _ = evict.notified() => {
                        if busy.load(Ordering::Acquire) == 0 {
                            break; // closes the socket
                        }
                        connection.as_mut().graceful_shutdown();
                    }
                    _ = stopping.changed(), if !shutting_down => {
                        shutting_down = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            table.lock().remove(&id);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    while tasks.join_next().await.is_some() {}
}

/// Raises this process's limit of open files to its hard limit (capped at 1,048,576), and
/// returns the soft limit now in force (`None` where it cannot be read).
pub fn raise_file_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid, writable `rlimit` for the call's whole duration;
        // getrlimit writes only into it.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return None;
        }
        let want = limit.rlim_max.min(1 << 20);
        if limit.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: `raised` is a valid `rlimit` read by the call only; a refusal leaves the
            // limit as it was, which the return value reports.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit.rlim_cur = want;
            }
        }
        usize::try_from(limit.rlim_cur).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_503_says_its_own_length() {
        let text = std::str::from_utf8(FULL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], "too_many_connections");
    }

    #[test]
    fn the_longest_idle_connection_makes_room() {
        let table = Table::default();
        let start = Instant::now();
        let mut evicts = Vec::new();
        for (id, (busy, idle_ms)) in [(0, 5), (1, 1), (0, 3)].into_iter().enumerate() {
            let evict = Arc::new(Notify::new());
            evicts.push(evict.clone());
            table.lock().insert(
                id as u64,
                Held {
                    busy: Arc::new(AtomicUsize::new(busy)),
                    idle_since: Arc::new(Mutex::new(start + Duration::from_millis(idle_ms))),
                    evict,
                },
            );
        }
        assert!(table.make_room(4), "room under the cap");
        assert_eq!(table.lock().len(), 3);
        // At the cap: connection 2 (idle since 3 ms) goes, not 0 (since 5 ms) nor busy 1.
        assert!(table.make_room(3));
        assert_eq!(table.lock().keys().copied().collect::<Vec<_>>(), [0, 1]);
        assert!(table.make_room(2));
        assert_eq!(table.lock().keys().copied().collect::<Vec<_>>(), [1]);
        // Only a busy connection is left: no room.
        assert!(!table.make_room(1));
        assert_eq!(table.lock().len(), 1);
    }

    #[test]
    fn the_file_limit_is_read() {
        assert!(raise_file_limit().is_some_and(|n| n >= 64));
    }
}
