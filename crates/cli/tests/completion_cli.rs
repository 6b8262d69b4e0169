//! `tandem completion`: scripts a shell loads, naming today's commands and flags.

use std::process::Command;

fn completion(shell: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["completion", shell])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "completion {shell}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completion_scripts_load_in_their_shell_and_know_the_commands_and_flags() {
    let bash = completion("bash");
    // bash parses it and defines the completion function.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("tandem.bash");
    std::fs::write(&script, &bash).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p tandem", script.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("_tandem"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for word in ["install", "peer", "--gateway-service-type", "load-image"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    assert!(completion("zsh").contains("#compdef tandem"));
    assert!(completion("fish").contains("complete -c tandem"));
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "tcsh is not offered");
}
