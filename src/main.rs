//! `agentd`: the daemon. Wires the configuration, the sans-io core, a driver and the
//! runtime together.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use agentd_core::Instance;
use agentd_io_common::{BoundListener, BufferedEntropy, Clock};

use agentd::{config, durable, runtime};

mod cli;

const HELP: &str = "\
agentd — an A2A 1.0 agent daemon

Usage: agentd [--config FILE] [--listen URL]... [--driver smol|std]
       agentd card|send|get|list|cancel|subscribe URL ...   (the client: below)
       agentd --check-config [--config FILE]
       agentd --print-config [--config FILE] [--listen URL]...
       agentd --extensions
       agentd --extension-schema NAME

With no configuration it serves http://127.0.0.1:8420/ (loopback; local callers are the
operator).

Options:
  --config FILE     read the TOML configuration FILE
  --listen URL      listen on URL instead of the configured a2a.listen (repeatable):
                    tcp://127.0.0.1:PORT (port 0: any free port) or unix:///PATH
  --check-config    check the configuration (--config FILE, else the embedded default)
                    as start-up would, without binding or opening the store; exit 0
                    when it would start, 2 with the load error when not
  --print-config    print the effective configuration (TOML: every key with the value in
                    force, defaults filled in, the agents' env and the peers' headers
                    redacted) after the checks of --check-config, and exit
  --driver NAME     smol (default: async, small) or std (blocking, a thread per connection)
  --extensions      print the registry of extension and binding URIs (JSON), and exit
  --extension-schema NAME
                    print the JSON Schema bundle of an extension (command, events or
                    task-annotations: the last segment of its URI), and exit
  -h, --help        print this help
  -V, --version     print the version

Environment:
  AGENTD_LOG        log level: error, warn, info (default), debug or trace
  AGENTD_LOG_FORMAT log lines: text (default) or json (one JSON object a line); wins
                    over the configuration's log.format
  AGENTD_LOCK_STATS 1: count the drivers' hold of the shared lock, printed as a
                    `lock-stats ...` line on stdout at each SIGUSR1 (for bench/)
";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Driver {
    Smol,
    Std,
}

struct Args {
    config: Option<PathBuf>,
    driver: Driver,
    /// `--listen`: replaces `a2a.listen` when given.
    listen: Vec<String>,
    check_only: bool,
    /// `--print-config`: check as `--check-config` does, then print the effective
    /// configuration.
    print_config: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        config: None,
        driver: Driver::Smol,
        listen: Vec::new(),
        check_only: false,
        print_config: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}\n{}", cli::HELP);
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("agentd {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--extensions" => {
                print!(
                    "{}",
                    agentd_core::ext::bundle::render(
                        &agentd_core::ext::registry::registry_document()
                    )
                );
                return Ok(None);
            }
            "--extension-schema" => {
                let name = it.next().ok_or(
                    "--extension-schema needs a name: command, events or task-annotations",
                )?;
                let ext = agentd_core::ext::Ext::from_name(&name).ok_or_else(|| {
                    if name == "jsonrpc-unix" {
                        "jsonrpc-unix is a protocol binding: it carries the JSON-RPC binding's own messages and has no schema bundle".to_owned()
                    } else {
                        format!("no extension named {name:?}; the names are command, events and task-annotations")
                    }
                })?;
                print!(
                    "{}",
                    agentd_core::ext::bundle::render(&agentd_core::ext::bundle::bundle(ext))
                );
                return Ok(None);
            }
            "--config" => {
                let v = it.next().ok_or("--config needs a file")?;
                args.config = Some(PathBuf::from(v));
            }
            "--listen" => {
                let v = it.next().ok_or(
                    "--listen needs a URL: tcp://127.0.0.1:PORT, https://HOST:PORT or unix:///PATH",
                )?;
                args.listen.push(v);
            }
            "--check-config" => args.check_only = true,
            "--print-config" => args.print_config = true,
            "--driver" => {
                args.driver = match it.next().as_deref() {
                    Some("smol") => Driver::Smol,
                    Some("std") => Driver::Std,
                    Some(other) => {
                        return Err(format!("--driver takes smol or std, not {other:?}"))
                    }
                    None => return Err("--driver needs a name: smol or std".into()),
                }
            }
            other => return Err(format!("unknown argument {other:?}; see agentd --help")),
        }
    }
    Ok(Some(args))
}

/// The level `AGENTD_LOG` names (any case; unset or empty: info). A value that names no
/// level is a usage error, not a silent `info`: an operator who asked for `debug` and
/// misspelled it must learn so before chasing missing lines.
fn log_level() -> Result<tracing::Level, String> {
    let value = match std::env::var("AGENTD_LOG") {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return Ok(tracing::Level::INFO),
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(format!(
                "AGENTD_LOG={v:?} names no log level: use error, warn, info, debug or trace"
            ))
        }
    };
    Ok(match value.trim().to_ascii_lowercase().as_str() {
        "" | "info" => tracing::Level::INFO,
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => {
            return Err(format!(
                "AGENTD_LOG={value:?} names no log level: use error, warn, info, debug or trace"
            ))
        }
    })
}

/// The log format: `AGENTD_LOG_FORMAT` when set (and not empty), else the configuration's
/// `log.format`, else text. A value that names no format is a usage error, as for
/// `AGENTD_LOG`.
fn log_format(config: Option<&config::Config>) -> Result<config::LogFormat, String> {
    match std::env::var("AGENTD_LOG_FORMAT") {
        Ok(v) if !v.trim().is_empty() => {
            config::LogFormat::parse(&v).map_err(|e| format!("AGENTD_LOG_FORMAT={e}"))
        }
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(format!("AGENTD_LOG_FORMAT={v:?} is not text or json"))
        }
        _ => Ok(config
            .and_then(|c| c.log.format.as_deref())
            .and_then(|f| config::LogFormat::parse(f).ok())
            .unwrap_or(config::LogFormat::Text)),
    }
}

fn init_logging(level: tracing::Level, format: config::LogFormat) {
    use tracing_subscriber::layer::SubscriberExt as _;
    let filter = tracing_subscriber::filter::LevelFilter::from_level(level);
    let ring = runtime::logring::LogRingLayer;
    let _ = match format {
        config::LogFormat::Text => {
            let fmt = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false);
            let subscriber = tracing_subscriber::registry()
                .with(filter)
                .with(fmt)
                .with(ring);
            tracing::subscriber::set_global_default(subscriber)
        }
        config::LogFormat::Json => {
            let subscriber = tracing_subscriber::registry()
                .with(filter)
                .with(agentd::logjson::JsonLayer)
                .with(ring);
            tracing::subscriber::set_global_default(subscriber)
        }
    };
}

/// Why the daemon could not run: a load error (the configuration) or a runtime one.
enum Failure {
    Config(String),
    Runtime(String),
}

fn run(args: Args, loaded: Result<config::Config, String>) -> Result<(), Failure> {
    let mut config = loaded.map_err(Failure::Config)?;
    config.override_listen(&args.listen);
    let endpoints = config.endpoints().map_err(Failure::Config)?;
    let settings = config.runtime_settings().map_err(Failure::Config)?;
    let declared = config.declared_commands().map_err(Failure::Config)?;
    let store_kind = config.store.resolve().map_err(Failure::Config)?;
    let telemetry = config.telemetry().map_err(Failure::Config)?;
    config
        .check_store(&store_kind, &endpoints)
        .map_err(Failure::Config)?;
    if args.check_only || args.print_config {
        // Everything start-up checks, short of binding and opening the store: the URLs the
        // card would name are the configured ones (a port 0 stays 0).
        let infos = endpoints.iter().map(unbound_info).collect();
        let mut instance_config = config.instance_config(infos).map_err(Failure::Config)?;
        instance_config.tls = config.tls_listeners(&endpoints).map_err(Failure::Config)?;
        let mut instance = Instance::new(
            instance_config,
            Box::new(BufferedEntropy::new()),
            Clock::new().now(),
        );
        for decl in declared {
            let op = decl.op.clone();
            instance
                .register_command(decl)
                .map_err(|e| Failure::Config(format!("workflow command {op:?}: {e:?}")))?;
        }
        if args.print_config {
            let text = agentd::printconfig::render(&config, instance.config(), &settings)
                .map_err(Failure::Config)?;
            print!("{text}");
            return Ok(());
        }
        let what = args
            .config
            .as_ref()
            .map_or("the embedded default".to_owned(), |p| {
                p.display().to_string()
            });
        println!("{what}: the configuration is valid");
        return Ok(());
    }
    let mut listeners = Vec::with_capacity(endpoints.len());
    for ep in &endpoints {
        listeners.push(
            BoundListener::bind_with_backlog(ep, config.limits.listen_backlog())
                .map_err(|e| Failure::Runtime(format!("cannot listen on {ep}: {e}")))?,
        );
    }
    // Unix socket files this process made: removed when it stops cleanly (the drivers'
    // handles, which would remove them, are waited on by threads that never return).
    let unix_paths: Vec<std::path::PathBuf> = endpoints
        .iter()
        .filter_map(|ep| match ep {
            agentd_io_common::Endpoint::Unix(path) => Some(path.clone()),
            _ => None,
        })
        .collect();
    let infos = listeners
        .iter()
        .zip(&endpoints)
        .map(|(l, ep)| l.info_tls(ep.is_tls()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::Runtime(format!("listener address: {e}")))?;
    let mut instance_config = config
        .instance_config(infos.clone())
        .map_err(Failure::Config)?;
    instance_config.tls = config.tls_listeners(&endpoints).map_err(Failure::Config)?;
    let clock = Clock::new();
    let mut instance = Instance::new(
        instance_config,
        Box::new(BufferedEntropy::new()),
        clock.now(),
    );
    for decl in declared {
        let op = decl.op.clone();
        instance
            .register_command(decl)
            .map_err(|e| Failure::Config(format!("workflow command {op:?}: {e:?}")))?;
    }
    if let Some(t) = &telemetry {
        let counts = agentd::telemetry::start(t).map_err(Failure::Runtime)?;
        instance.set_trace_requests(true);
        instance.add_metrics_source(Arc::new(agentd::telemetry::TraceMetrics(counts)));
        agentd_io_common::log::set_record_sink(agentd::telemetry::on_record);
    }
    let mut first_records = Vec::new();
    let store = match &store_kind {
        durable::StoreKind::Memory => None,
        durable::StoreKind::File(dir) => {
            let opening = std::time::Instant::now();
            let (store, restored, first) =
                durable::open(dir, &mut instance, clock.now()).map_err(Failure::Runtime)?;
            let open_ms = opening.elapsed().as_millis() as u64;
            if let Some(cut) = &restored.truncated {
                tracing::warn!(truncation = %cut, "store: a damaged journal tail was cut off");
            }
            first_records = first;
            tracing::info!(
                dir = %dir.display(),
                tasks = restored.tasks,
                ended_in_flight = restored.ended,
                skipped = restored.skipped,
                open_ms,
                "store opened"
            );
            Some(store)
        }
    };
    // The restore's garbage (the records read back, the parse's buffers) is free now but
    // still held by the allocator: give it back before serving.
    agentd::memory::trim();
    let instance = Arc::new(Mutex::new(instance));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let pump = match store {
        Some(store) => Some(
            durable::spawn(instance.clone(), store, first_records)
                .map_err(|e| Failure::Runtime(format!("store: {e}")))?,
        ),
        None => None,
    };
    // With smol the runtime is a task on the driver's executor; with std, a thread.
    let (runtime, runtime_task) = match args.driver {
        Driver::Smol => runtime::start_task(instance.clone(), clock, settings)
            .map(|(h, t)| (h, Some(t)))
            .map_err(|e| Failure::Runtime(format!("runtime: {e}")))?,
        Driver::Std => runtime::spawn(instance.clone(), clock, settings)
            .map(|h| (h, None))
            .map_err(|e| Failure::Runtime(format!("runtime thread: {e}")))?,
    };
    let max_connections = config.limits.max_connections;
    let smol_threads = config.limits.smol_threads();
    let reload_instance = instance.clone();
    if std::env::var_os("AGENTD_LOCK_STATS").is_some_and(|v| !v.is_empty() && v != "0") {
        lock_stats_on_sigusr1()?;
    }
    match args.driver {
        Driver::Smol => {
            let mut opts = agentd_io_smol::DriverOptions {
                threads: smol_threads,
                ..Default::default()
            };
            if let Some(n) = max_connections {
                opts.max_connections = n;
            }
            let h = agentd_io_smol::serve(instance, listeners, opts, clock)
                .map_err(|e| Failure::Runtime(e.to_string()))?;
            if let Some(task) = runtime_task {
                h.spawn(task);
            }
            agentd::memory::spawn_trimmer(h.connections())
                .map_err(|e| Failure::Runtime(format!("trim thread: {e}")))?;
            let tx = done_tx.clone();
            std::thread::spawn(move || {
                h.wait();
                let _ = tx.send(Err("the driver stopped".into()));
            });
        }
        Driver::Std => {
            if config.limits.smol_threads.is_some() {
                tracing::warn!(
                    "limits.smol_threads is the smol driver's; the std driver runs a thread per connection"
                );
            }
            let mut opts = agentd_io_std::DriverOptions::default();
            if let Some(n) = max_connections {
                opts.max_connections = n;
            }
            let h = agentd_io_std::serve(instance, listeners, opts, clock)
                .map_err(|e| Failure::Runtime(e.to_string()))?;
            agentd::memory::spawn_trimmer(h.connections())
                .map_err(|e| Failure::Runtime(format!("trim thread: {e}")))?;
            let tx = done_tx.clone();
            std::thread::spawn(move || {
                h.wait();
                let _ = tx.send(Err("the driver stopped".into()));
            });
        }
    }
    // SIGTERM (and SIGINT) drain gracefully; a second one ends the process at once.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| Failure::Runtime(format!("signal handlers: {e}")))?;
    // SIGHUP reloads the configuration (see `agentd::reload`); registered before the
    // listeners are announced, so an early SIGHUP never takes the default action (exit).
    let mut hangups = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
        .map_err(|e| Failure::Runtime(format!("signal handlers: {e}")))?;
    {
        let mut state =
            agentd::reload::State::new(args.config.clone(), args.listen.clone(), &config);
        let reloader = runtime.reload_handle();
        let instance = reload_instance;
        std::thread::Builder::new()
            .name("agentd-reload".into())
            .spawn(move || {
                for _ in hangups.forever() {
                    tracing::info!("SIGHUP: reloading the configuration");
                    agentd::reload::reload(&mut state, &instance, &reloader);
                }
            })
            .map_err(|e| Failure::Runtime(format!("reload thread: {e}")))?;
    }
    let drainer = runtime.drain_handle();
    let exit = runtime.exit;
    let drain_tx = {
        let tx = done_tx.clone();
        std::thread::spawn(move || {
            if exit.recv().is_ok() {
                let _ = tx.send(Ok(()));
            }
        });
        runtime_drainer(drainer)
    };
    std::thread::spawn(move || {
        let mut seen = 0;
        for sig in signals.forever() {
            seen += 1;
            if seen > 1 {
                tracing::warn!(signal = sig, "second signal: exiting without waiting");
                std::process::exit(1);
            }
            tracing::info!(signal = sig, "signal received: draining");
            drain_tx("signal");
        }
    });
    for info in &infos {
        tracing::info!(url = %info.url, driver = ?args.driver, "listening");
        // One machine-readable line per listener, for scripts and tests (port 0 binds any).
        println!("listening {}", info.url);
    }
    let outcome = done_rx.recv();
    if let Some(pump) = pump {
        // The last changes (a drain's final states) are written before the process ends.
        pump.finish();
    }
    // The spans of the last requests, best effort.
    agentd::telemetry::flush(std::time::Duration::from_secs(2));
    for path in &unix_paths {
        let _ = std::fs::remove_file(path);
    }
    match outcome {
        Ok(Ok(())) | Err(_) => Ok(()),
        Ok(Err(e)) => Err(Failure::Runtime(e)),
    }
}

/// What the card of a listener on `ep` would name, without binding it (`--check-config`).
fn unbound_info(ep: &agentd_io_common::Endpoint) -> agentd_core::ListenerInfo {
    use agentd_core::{ListenerInfo, ListenerKind};
    use agentd_io_common::Endpoint;
    match ep {
        Endpoint::Tcp(a) | Endpoint::Https(a) => ListenerInfo {
            kind: ListenerKind::Tcp,
            url: format!("{}://{a}/", if ep.is_tls() { "https" } else { "http" }),
            loopback: a.ip().is_loopback(),
        },
        Endpoint::Unix(path) => ListenerInfo {
            kind: ListenerKind::Unix(path.display().to_string()),
            url: format!("unix://{}", path.display()),
            loopback: false,
        },
    }
}

/// `AGENTD_LOCK_STATS`: counts how long the drivers hold the shared instance lock
/// ([`agentd_io_common::lockstat`]), and prints the totals so far as one line on stdout at
/// each SIGUSR1 (`bench/run.sh` reads them before and after a load). Unset, nothing is
/// counted and SIGUSR1 keeps its default action.
fn lock_stats_on_sigusr1() -> Result<(), Failure> {
    use agentd_io_common::lockstat;
    let mut usr1 = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
        .map_err(|e| Failure::Runtime(format!("signal handlers: {e}")))?;
    lockstat::enable();
    std::thread::Builder::new()
        .name("agentd-lock-stats".into())
        .spawn(move || {
            for _ in usr1.forever() {
                println!("{}", lockstat::snapshot().line());
            }
        })
        .map_err(|e| Failure::Runtime(format!("lock stats thread: {e}")))?;
    Ok(())
}

fn runtime_drainer(h: runtime::DrainHandle) -> impl Fn(&str) {
    move |reason| h.drain(reason)
}

fn main() -> ExitCode {
    // A keeper of one child process (see `agentd::runtime::child`): nothing else runs.
    let mut argv = std::env::args_os().skip(1);
    if argv
        .next()
        .is_some_and(|a| a == runtime::child::KEEPER_FLAG)
    {
        runtime::child::keeper_main(argv);
    }
    // `agentd card|send|get|list|cancel|subscribe|help ...`: the client, not the daemon.
    let words: Vec<String> = std::env::args().skip(1).collect();
    if let Some(name) = words
        .first()
        .filter(|w| cli::SUBCOMMANDS.contains(&w.as_str()))
    {
        return cli::main(name, &words[1..]);
    }
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentd: {e}");
            return ExitCode::from(2);
        }
    };
    // Before any thread starts: see `agentd::memory`.
    let thread_per_connection = matches!(args.driver, Driver::Std);
    agentd::memory::limit_arenas(agentd::memory::default_arenas(thread_per_connection));
    let level = match log_level() {
        Ok(level) => level,
        Err(e) => {
            eprintln!("agentd: {e}");
            return ExitCode::from(2);
        }
    };
    // The file is read before the log starts, for its log.format; a load error is logged
    // (in the format asked for) once the log is up.
    let loaded = match &args.config {
        Some(path) => config::Config::load(path),
        None => Ok(config::Config::default()),
    };
    let format = match log_format(loaded.as_ref().ok()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("agentd: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(level, format);
    // The runtime's children run under a keeper (this binary again, by the kernel's
    // /proc/self/exe, which still names it if the file on disk is replaced), so they die with
    // the daemon however it dies.
    runtime::child::use_keeper(PathBuf::from("/proc/self/exe"));
    // Each fatal error is said once, as a log line (stderr, like every other line).
    match run(args, loaded) {
        Ok(()) => ExitCode::SUCCESS,
        // A load error exits 2, like a usage error: the configuration must change.
        Err(Failure::Config(e)) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(e)) => {
            tracing::error!("{e}");
            ExitCode::from(1)
        }
    }
}
