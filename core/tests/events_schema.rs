#[test]
fn dump() {
    std::fs::write(
        "/tmp/evdiff/ours.json",
        serde_json::to_string_pretty(&agentd_core::ext::events_schema::bundle()).unwrap(),
    )
    .unwrap();
}
