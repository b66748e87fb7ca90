//! A running server: binds its address, loads the model on the compute thread while already
//! answering, serves HTTP on its own thread (a small tokio runtime, [`super::listen`]), and
//! shuts down gracefully (see the parent module's docs).

use super::metrics::Metrics;
use super::model_names::ModelNames;
use super::load::compute;
use super::{listen, router, App, ServeConfig};
use crate::error::{Error, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// A running server.
pub struct Server {
    /// Where it listens (the port the OS chose when asked for port 0).
    pub addr: SocketAddr,
    app: Arc<App>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<JoinHandle<Result<()>>>,
}

impl Server {
    /// Binds `config.addr`, then loads the model on the compute thread while already answering
    /// (`/health` is 503 until the model is ready).
    pub fn start(config: ServeConfig) -> Result<Server> {
        let listener = std::net::TcpListener::bind(config.addr)
            .map_err(|e| Error::Input(format!("cannot listen on {}: {e}", config.addr)))?;
        let io = |what: &str, e: std::io::Error| Error::Input(format!("{what}: {e}"));
        listener
            .set_nonblocking(true)
            .map_err(|e| io("cannot set up the listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("cannot set up the listener", e))?;
        let own_name = config
            .model
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned());
        let model_name = config
            .served_model_name
            .clone()
            .unwrap_or_else(|| own_name.clone());
        // The cap stays under the limit of open files, with room for the model's files.
        let files = listen::raise_file_limit().unwrap_or(1024);
        let limits = listen::ConnectionLimits {
            max_connections: config.max_connections.min(files.saturating_sub(64)).max(1),
            header_timeout: std::time::Duration::from_secs_f64(config.header_timeout_s.max(0.001)),
        };
        let mut own = vec![model_name.clone()];
        if own_name != model_name {
            own.push(own_name);
        }
        let names = ModelNames::new(vec![own]);
        let started_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let metrics = Arc::new(Metrics::default());
        metrics.set_model_name(&model_name);
        let app = Arc::new(App {
            config,
            metrics,
            served: OnceLock::new(),
            load_error: OnceLock::new(),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            model_name,
            names,
            started_unix,
        });
        let compute_app = app.clone();
        std::thread::Builder::new()
            .name("compute".into())
            .spawn(move || compute(compute_app))
            .map_err(|e| io("cannot start the compute thread", e))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let http_app = app.clone();
        let http = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || -> Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| io("cannot start the async runtime", e))?;
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .map_err(|e| io("cannot set up the listener", e))?;
                    let draining = http_app.clone();
                    let shutdown = async move {
                        shutdown_signal(stopped).await;
                        draining.draining.store(true, Ordering::Relaxed);
                    };
                    listen::serve(listener, router(http_app), limits, shutdown).await;
                    Ok(())
                })
            })
            .map_err(|e| io("cannot start the HTTP thread", e))?;
        Ok(Server {
            addr,
            app,
            stop: Some(stop),
            http: Some(http),
        })
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.app.metrics
    }

    /// Waits until the model is loaded (`Ok`) or failed to load (its error).
    pub fn wait_ready(&self) -> Result<()> {
        loop {
            if self.app.served.get().is_some() {
                return Ok(());
            }
            if let Some(e) = self.app.load_error.get() {
                return Err(Error::Input(e.clone()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Blocks until the server has shut down (SIGTERM or Ctrl-C) and its requests finished.
    pub fn wait(mut self) -> Result<()> {
        self.join()
    }

    /// Stops accepting, lets running requests finish, and returns when they have.
    pub fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        match self.http.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::Input("the HTTP thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.join();
    }
}

/// Resolves on SIGTERM, Ctrl-C or `stopped`.
async fn shutdown_signal(stopped: tokio::sync::oneshot::Receiver<()>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
        _ = stopped => {},
    }
}
