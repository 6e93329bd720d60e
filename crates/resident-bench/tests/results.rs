//! Every result file committed under `bench/results/` is JSON and names the command that
//! produced it (a file that does not parse, or that cannot be reproduced, is not a result).

use std::path::Path;

#[test]
fn committed_results_parse_and_name_their_command() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("bench/results exists") {
        let path = entry.expect("readable folder").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable file");
        let doc: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        let command = doc.get("command").or_else(|| doc.get("commands"));
        assert!(
            command.is_some_and(|c| !c.is_null() && c.to_string().len() > 4),
            "{} names no command",
            path.display()
        );
        checked += 1;
    }
    assert!(checked > 0, "no result files in {}", dir.display());
}
