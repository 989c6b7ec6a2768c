#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = apf_wasm_fuzz::targets::host_pairs(data);
});
