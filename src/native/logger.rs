//! The `log` crate's records through Envoy's `dynamic_modules` logger.

use super::abi;

struct EnvoyLogger;

fn level(l: log::Level) -> u32 {
    match l {
        log::Level::Error => abi::LOG_ERROR,
        log::Level::Warn => abi::LOG_WARN,
        log::Level::Info => abi::LOG_INFO,
        log::Level::Debug | log::Level::Trace => abi::LOG_DEBUG,
    }
}

impl log::Log for EnvoyLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        abi::log_enabled(level(m.level()))
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            abi::log(level(r.level()), &r.args().to_string());
        }
    }

    fn flush(&self) {}
}

static LOGGER: EnvoyLogger = EnvoyLogger;

/// Installs the logger (once per process) and logs panics through it.
pub fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
    std::panic::set_hook(Box::new(|info| log::error!("apf: panic: {info}")));
}
