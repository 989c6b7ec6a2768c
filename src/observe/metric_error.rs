//! Why no Envoy stat name can be made for a metric and label values (a caller's mistake: the
//! gateway skips the series).
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatNameError {
    /// The number of label values differs from the metric's labels.
    LabelCount { metric: &'static str, want: usize, got: usize },
    /// `stat_name` of a histogram (it has several series).
    IsHistogram { metric: &'static str },
    /// `histogram_stat_names` of a counter or gauge.
    NotHistogram { metric: &'static str },
}

impl fmt::Display for StatNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatNameError::LabelCount { metric, want, got } => write!(f, "metric {metric} takes {want} label values, got {got}"),
            StatNameError::IsHistogram { metric } => write!(f, "metric {metric} is a histogram: use histogram_stat_names"),
            StatNameError::NotHistogram { metric } => write!(f, "metric {metric} is not a histogram"),
        }
    }
}

impl std::error::Error for StatNameError {}
