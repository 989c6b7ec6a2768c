//! `apf`: the native CLI over the same core as the Envoy filter.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = apf_wasm::cli::main_with(&args, &mut stdout.lock(), &mut stderr.lock());
    std::process::exit(code);
}
