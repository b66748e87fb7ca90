//! `transformer serve --model PATH [--host 127.0.0.1 --port 8080 | --addr HOST:PORT]`: the model behind an HTTP server
//! (OpenAI-compatible endpoints, LibreTranslate's `/translate`, a web page at `/`, Prometheus
//! metrics); see `crate::serve`.

use super::args::PrecisionArg;
use super::set_threads;
use crate::serve::scheduler::DEFAULT_PREFILL_STEP_MS;
use crate::serve::{ServeConfig, Server};
use crate::text::languages::{check_code, LanguagePair};
use anyhow::{bail, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A language model (a `train-lm` directory, a Hugging Face Llama/GPT-2 directory, a
    /// Llama-family .gguf file), a translation model directory (`train`, `demo --out`) or a
    /// BERT encoder directory (all-MiniLM-L6-v2). Repeat for several translation models of
    /// different languages: `/translate` goes to the model of the pair, or through English
    /// with two of them (as LibreTranslate pivots); the first answers what names no pair.
    #[arg(long, required = true)]
    pub model: Vec<PathBuf>,
    /// Address and port to listen on (`HOST:PORT`, a name such as `localhost:8080` included);
    /// instead of --host and --port.
    #[arg(long, conflicts_with_all = ["host", "port"])]
    pub addr: Option<String>,
    /// Host to listen on (an address or a name).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The key clients must send (`Authorization: Bearer KEY`) on every route but /health;
    /// default: the TRANSFORMER_API_KEY environment variable; neither: no key.
    #[arg(long)]
    pub api_key: Option<String>,
    /// An origin whose pages may call the server (CORS), e.g. `http://localhost:3000`; `*` for
    /// any. Repeat for several.
    #[arg(long)]
    pub cors_origin: Vec<String>,
    /// A host name accepted in the Host header beyond localhost and IP addresses (a guard
    /// against DNS rebinding); `*` for any. Repeat for several.
    #[arg(long)]
    pub allowed_host: Vec<String>,
    /// The model's name in the API (`model` of requests and responses, /v1/models); default:
    /// the model path's file name (also accepted).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Connections held at most; past it a new connection replaces the longest-idle one.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds a connection has to send a request's headers (then it is closed).
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Request bodies at most, in MiB (then 413).
    #[arg(long, default_value_t = 2.0)]
    pub max_body_mib: f64,
    /// Memory of the paged KV cache pool, in MiB: a request is admitted only when the blocks
    /// for its prompt plus max_tokens are free.
    #[arg(long, default_value_t = 512)]
    pub kv_memory: usize,
    /// Sequences decoded together at most (the running batch; a translation model: sentences).
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Requests waiting for admission at most; more get 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Prompt tokens at most (default: the model's context less one).
    #[arg(long)]
    pub max_input_tokens: Option<usize>,
    /// max_tokens at most.
    #[arg(long, default_value_t = 2048)]
    pub max_output_tokens: usize,
    /// Seconds a request may take, waiting included (then 504, or an error event).
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Tokens one forward pass feeds at most (decode tokens plus prompt chunks; a translation
    /// model: source tokens encoded per step, padding included): the longest step, so how long
    /// a new request waits behind a long prompt (llama-server's --ubatch-size). Default: a
    /// language model's is timed (sized from the steps run so one takes about
    /// --prefill-step-ms; 32 per model thread at first, 16 to 512), a translation model's 512.
    #[arg(long, alias = "ubatch-size")]
    pub prefill_budget: Option<usize>,
    /// Without --prefill-budget, the time a language model's step is sized to take, in
    /// milliseconds: b = clamp(step / (seconds per token of recent steps), 16, 512).
    #[arg(long, default_value_t = DEFAULT_PREFILL_STEP_MS)]
    pub prefill_step_ms: u32,
    /// Positions per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Turns prefix caching off: every prompt is prefilled whole, even when another request
    /// already fed its first blocks (for comparison).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Requests that may be admitted ahead of one that waits for KV blocks before it gets
    /// priority (then nothing is admitted until it fits); 0: strict first come, first served.
    #[arg(long, default_value_t = 16)]
    pub max_overtakes: usize,
    /// A translation model's source language code (`/languages`, LibreTranslate's `source`);
    /// default: the one `train --source-lang` recorded in the model (`languages.json`), or a
    /// Marian model's `tokenizer_config.json` (`source_lang`), else unnamed (`src`, and any
    /// code a client sends is accepted). A multilingual model (NLLB, M2M100) translates between
    /// any of its languages: this is the source of requests that say `auto` (default: its
    /// `tokenizer_config.json`'s `src_lang`), and --target-lang the target of requests that
    /// name none.
    #[arg(long)]
    pub source_lang: Option<String>,
    /// A translation model's target language code; default as for --source-lang.
    #[arg(long)]
    pub target_lang: Option<String>,
    /// The numbers the model's products use (see `generate --precision`).
    #[arg(long, value_enum, default_value_t)]
    pub precision: PrecisionArg,
    /// Where a language model runs: its weights and key/value pool (--kv-memory) in the
    /// device's memory on a GPU (blocks of 16 positions, no prefix caching).
    #[command(flatten)]
    pub device: super::args::DeviceArgs,
    /// Tokens one sequence holds at most, prompt and output (llama-server's -c; default and
    /// most: the model's context).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    #[command(flatten)]
    pub cache: super::args::CacheTypeArgs,
    /// The max_tokens of a request that gives none (llama-server's -n; default: 16 for
    /// completions, 512 for chat).
    #[arg(long)]
    pub n_predict: Option<usize>,
    /// The seed of a request that gives none (default: a new one per request).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The temperature of a request that gives none.
    #[arg(long, default_value_t = 1.0)]
    pub temp: f64,
    /// Answers GET /slots with 501 (llama-server's --no-slots).
    #[arg(long)]
    pub no_slots: bool,
    /// Answers GET /metrics with 501 (llama-server serves /metrics only with --metrics).
    #[arg(long)]
    pub no_metrics: bool,
    /// Serves no web page: GET / is 404 (llama-server's --no-webui).
    #[arg(long, visible_alias = "no-ui")]
    pub no_webui: bool,
    /// Lets allowed CORS origins send credentials: answers name the origin, never `*`
    /// (llama-server's --cors-credentials, on there by default).
    #[arg(long)]
    pub cors_credentials: bool,
    /// A sequence that fills its context (--ctx-size) goes on: the tokens after the prompt's
    /// first n_keep (a request field, default 0) are halved, the older half discarded, and
    /// generation continues from the rest (llama-server's --context-shift).
    #[arg(long)]
    pub context_shift: bool,
    /// Worker threads for the model (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// The environment variable the API key is read from when --api-key is not given.
pub const API_KEY_VARIABLE: &str = "TRANSFORMER_API_KEY";

/// The socket address to bind (--addr, else --host and --port; names resolved, IPv4 first),
/// and the host name given when it is a name (then accepted in the Host header).
fn listen_address(args: &ServeArgs) -> Result<(SocketAddr, Option<String>)> {
    let (host, text) = match &args.addr {
        Some(a) => {
            let host = match a.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => h,
                _ => bail!("--addr {a:?} must be HOST:PORT (e.g. 127.0.0.1:8080, localhost:8080)"),
            };
            (host.trim_matches(['[', ']']).to_string(), a.clone())
        }
        None => {
            let host = args.host.trim_matches(['[', ']']).to_string();
            let text = match host.contains(':') {
                true => format!("[{host}]:{}", args.port),
                false => format!("{host}:{}", args.port),
            };
            (host, text)
        }
    };
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&text)
        .map_err(|e| anyhow::anyhow!("cannot resolve the address {text:?} to listen on: {e}"))?
        .collect();
    let Some(addr) = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()) else {
        bail!("the address {text:?} to listen on resolves to nothing");
    };
    let name = host.parse::<std::net::IpAddr>().is_err().then_some(host);
    Ok((*addr, name))
}

/// The translation pair's codes: the flags, else the model's `languages.json` (or Argos
/// package's `metadata.json`), else the unnamed `src` → `tgt`.
fn language_codes(args: &ServeArgs) -> Result<(String, String)> {
    let first = &args.model[0];
    let recorded = match LanguagePair::read(first)? {
        Some(pair) => Some(pair),
        None => crate::pipeline::argos::package_pair(first)?,
    };
    let mut codes = Vec::new();
    for (flag, given, recorded, unnamed) in [
        (
            "--source-lang",
            &args.source_lang,
            recorded.as_ref().map(|p| &p.source),
            "src",
        ),
        (
            "--target-lang",
            &args.target_lang,
            recorded.as_ref().map(|p| &p.target),
            "tgt",
        ),
    ] {
        if let Some(code) = given {
            check_code(flag, code).map_err(anyhow::Error::msg)?;
        }
        codes.push(
            given
                .as_ref()
                .or(recorded)
                .map_or(unnamed, |c| c)
                .to_string(),
        );
    }
    let target = codes.pop().expect("two codes");
    let source = codes.pop().expect("two codes");
    if source == target {
        bail!("the source and target languages are both {source:?}");
    }
    Ok((source, target))
}

/// The model paths, for messages.
fn model_list(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

pub fn run(args: ServeArgs) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!(
            "--timeout {} must be a positive number of seconds",
            args.timeout
        );
    }
    for (name, v) in [
        ("--kv-memory", args.kv_memory),
        ("--max-batch", args.max_batch),
        ("--max-output-tokens", args.max_output_tokens),
        ("--prefill-budget", args.prefill_budget.unwrap_or(1)),
        ("--prefill-step-ms", args.prefill_step_ms as usize),
        ("--block-size", args.block_size),
    ] {
        if v == 0 {
            bail!("{name} must be at least 1");
        }
    }
    if !(args.header_timeout.is_finite() && args.header_timeout > 0.0) {
        bail!(
            "--header-timeout {} must be a positive number of seconds",
            args.header_timeout
        );
    }
    if !(args.max_body_mib.is_finite() && args.max_body_mib > 0.0 && args.max_body_mib <= 4096.0) {
        bail!("--max-body-mib {} must be in (0, 4096]", args.max_body_mib);
    }
    if !(args.temp.is_finite() && args.temp >= 0.0) {
        bail!("--temp {} must be >= 0", args.temp);
    }
    if args.ctx_size == Some(0) || args.n_predict == Some(0) {
        bail!("--ctx-size and --n-predict must be at least 1");
    }
    if args.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let (addr, host_name) = listen_address(&args)?;
    let api_key = match &args.api_key {
        Some(k) => Some(k.clone()),
        None => std::env::var(API_KEY_VARIABLE).ok(),
    };
    if api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("the API key (--api-key or {API_KEY_VARIABLE}) is empty");
    }
    let mut allowed_hosts = args.allowed_host.clone();
    allowed_hosts.extend(host_name);
    let (source_lang, target_lang) = language_codes(&args)?;
    let threads = set_threads(args.threads)?;
    let device = args.device.choice()?;
    let precision = args.device.precision(
        device,
        &args.model[0],
        args.precision.model_precision(),
        false,
        &args.cache,
    )?;
    if device != crate::pipeline::device::DeviceChoice::Cpu && args.block_size != 16 {
        bail!(
            "--block-size {}: a GPU's key/value blocks hold 16 positions",
            args.block_size
        );
    }
    let config = ServeConfig {
        kv_memory_mib: args.kv_memory,
        kv_types: args.cache.types(),
        max_batch: args.max_batch,
        max_queue: args.max_queue,
        max_input_tokens: args.max_input_tokens,
        max_output_tokens: args.max_output_tokens,
        timeout_s: args.timeout,
        block_rows: args.block_size,
        prefill_budget: args.prefill_budget,
        prefill_step_ms: args.prefill_step_ms,
        prefix_cache: !args.no_prefix_cache,
        max_overtakes: args.max_overtakes,
        source_lang,
        target_lang,
        precision,
        device,
        api_key,
        cors_origins: args.cors_origin.clone(),
        cors_credentials: args.cors_credentials,
        allowed_hosts,
        served_model_name: args.served_model_name.clone(),
        max_connections: args.max_connections,
        header_timeout_s: args.header_timeout,
        max_body_bytes: (args.max_body_mib * (1 << 20) as f64) as usize,
        llama: crate::serve::native::LlamaOptions {
            ctx_size: args.ctx_size,
            n_predict: args.n_predict,
            seed: args.seed,
            temperature: args.temp,
            slots: !args.no_slots,
            metrics: !args.no_metrics,
            webui: !args.no_webui,
            ctx_shift: args.context_shift,
        },
        more_models: args.model[1..].to_vec(),
        ..ServeConfig::new(args.model[0].clone(), addr)
    };
    let server = Server::start(config)?;
    eprintln!(
        "listening on http://{} ({threads} threads); loading {}",
        server.addr,
        model_list(&args.model)
    );
    if let Err(e) = server.wait_ready() {
        let _ = server.shutdown();
        bail!("{}: {e}", model_list(&args.model));
    }
    eprintln!(
        "ready: open http://{}/ in a browser (SIGTERM or Ctrl-C stops)",
        server.addr
    );
    server.wait()?;
    eprintln!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn address(args: &[&str]) -> Result<(SocketAddr, Option<String>)> {
        let cli = Cli::try_parse_from(["serve", "--model", "m"].iter().chain(args))?;
        listen_address(&cli.serve)
    }

    #[test]
    fn addresses_by_host_port_or_addr() {
        let ip = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(address(&[]).unwrap(), (ip("127.0.0.1:8080"), None));
        assert_eq!(
            address(&["--addr", "localhost:9000"]).unwrap(),
            (ip("127.0.0.1:9000"), Some("localhost".into()))
        );
        assert_eq!(
            address(&["--host", "0.0.0.0", "--port", "81"]).unwrap(),
            (ip("0.0.0.0:81"), None)
        );
        assert_eq!(
            address(&["--host", "::1", "--port", "81"]).unwrap(),
            (ip("[::1]:81"), None)
        );
        assert_eq!(
            address(&["--addr", "[::1]:82"]).unwrap(),
            (ip("[::1]:82"), None)
        );
        for bad in [
            vec!["--addr", "localhost"],
            vec!["--addr", "1.2.3.4:99999"],
            vec!["--addr", "127.0.0.1:80", "--port", "81"],
            vec!["--host", "no such host.invalid"],
        ] {
            assert!(address(&bad).is_err(), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod language_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn codes(model: &std::path::Path, flags: &[&str]) -> Result<(String, String)> {
        let mut argv = vec!["serve", "--model", model.to_str().unwrap()];
        argv.extend(flags);
        language_codes(&Cli::try_parse_from(argv)?.serve)
    }

    /// The flags win, then the model's `languages.json`, then the unnamed pair.
    #[test]
    fn language_codes_come_from_flags_then_the_model() {
        let dir = std::env::temp_dir().join(format!("serve-langs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pair = |s: &str, t: &str| (s.to_string(), t.to_string());
        assert_eq!(codes(&dir, &[]).unwrap(), pair("src", "tgt"));
        std::fs::write(
            dir.join(crate::text::languages::LANGUAGES_FILE),
            r#"{"source": "de", "target": "en"}"#,
        )
        .unwrap();
        assert_eq!(codes(&dir, &[]).unwrap(), pair("de", "en"));
        assert_eq!(
            codes(&dir, &["--target-lang", "es"]).unwrap(),
            pair("de", "es")
        );
        let e = codes(&dir, &["--source-lang", "e n"]).unwrap_err();
        assert!(e.to_string().contains("--source-lang"), "{e}");
        let e = codes(&dir, &["--source-lang", "en"]).unwrap_err();
        assert!(e.to_string().contains("both"), "{e}");
        std::fs::write(dir.join(crate::text::languages::LANGUAGES_FILE), "{").unwrap();
        let e = codes(&dir, &[]).unwrap_err();
        assert!(e.to_string().contains("languages.json"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
