#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = apf_wasm_fuzz::targets::etcd_response(data);
});
