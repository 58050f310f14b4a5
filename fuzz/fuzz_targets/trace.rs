//! The trace file reader, and the dump of whatever it accepts.
#![no_main]

use phalanx_core::trace::{Trace, dump};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = Trace::parse(data) {
        drop(dump(&trace));
    }
});
