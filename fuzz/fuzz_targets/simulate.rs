#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = apf_wasm_fuzz::targets::simulate_capped(data, u64::MAX);
});
