//! One connection's byte stream, in chunks the input picks, through `Session::process`
//! (either protocol), with the invariants `tests/support/fuzz_driver.rs` checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/support/fuzz_driver.rs"]
mod fuzz_driver;

fuzz_target!(|data: &[u8]| {
    fuzz_driver::run(data);
});
