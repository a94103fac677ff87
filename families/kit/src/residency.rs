//! Host residency while a family decodes: a thread samples this process's
//! `RssAnon` and `RssFile` and the model mapping's resident bytes every few
//! milliseconds, so a report can state the peaks of the decode alone (the
//! forward's working memory, and whether the mapping's pages come back
//! after the seam released them). Run it in a child process: a test
//! harness's other threads would count.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

/// Peaks over the sampled window, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DecodePeaks {
    /// Samples taken.
    pub samples: u64,
    /// `RssAnon` when sampling started.
    pub rss_anon_start: u64,
    /// The largest `RssAnon` seen.
    pub rss_anon_peak: u64,
    /// The largest `RssFile` seen.
    pub rss_file_peak: u64,
    /// The largest resident size of the model's mapping seen.
    pub mapping_rss_peak: u64,
    /// The mapping's resident size when sampling stopped.
    pub mapping_rss_end: u64,
}

/// A running sampler; [`DecodeSampler::stop`] returns the peaks.
#[derive(Debug)]
pub struct DecodeSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<DecodePeaks>,
}

fn sample(mapping: usize, peaks: &mut DecodePeaks) {
    if let Ok(r) = seam::residency::current() {
        peaks.rss_anon_peak = peaks.rss_anon_peak.max(r.rss_anon);
        peaks.rss_file_peak = peaks.rss_file_peak.max(r.rss_file);
    }
    if let Ok(Some(m)) = seam::residency::mapping_rss(mapping as *const u8) {
        peaks.mapping_rss_peak = peaks.mapping_rss_peak.max(m);
        peaks.mapping_rss_end = m;
    }
    peaks.samples += 1;
}

impl DecodeSampler {
    /// Starts sampling every `every`; `mapping` is any address inside the
    /// model's mapping (a borrow's bytes).
    pub fn start(mapping: *const u8, every: Duration) -> DecodeSampler {
        let mapping = mapping as usize;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let mut peaks = DecodePeaks {
            rss_anon_start: seam::residency::current().map_or(0, |r| r.rss_anon),
            ..DecodePeaks::default()
        };
        sample(mapping, &mut peaks);
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                sample(mapping, &mut peaks);
            }
            sample(mapping, &mut peaks);
            peaks
        });
        DecodeSampler { stop, thread }
    }

    /// Stops sampling (one last sample) and returns the peaks.
    pub fn stop(self) -> DecodePeaks {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_while_sampling_shows_in_the_anonymous_peak() {
        let probe = vec![0u8; 4096];
        let sampler = DecodeSampler::start(probe.as_ptr(), Duration::from_millis(1));
        let mut big = vec![0u8; 64 << 20];
        big.iter_mut().step_by(4096).for_each(|b| *b = 1);
        std::thread::sleep(Duration::from_millis(20));
        let touched = big.iter().step_by(4096).count();
        drop(big);
        let peaks = sampler.stop();
        assert_eq!(touched, 16384);
        assert!(peaks.samples >= 3, "{peaks:?}");
        assert!(
            peaks.rss_anon_peak >= peaks.rss_anon_start + (48 << 20),
            "{peaks:?}"
        );
    }
}
