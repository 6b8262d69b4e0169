include!("../../build/root_cfg.rs");

fn main() {
    emit_root_cfg();
}
