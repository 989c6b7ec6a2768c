//! One Limited priority level for the engine's tests: the configuration JSON of a level `name`
//! with exactly `seats` seats (NominalCL = ceil(S·NCS/(NCS+5)) with NCS 95, lendable 0 and
//! borrowing 0) and a FlowSchema of the same name sending every authenticated user there, flows
//! by user. Integration tests include it with `#[path = "common/one_level.rs"] mod one_level;`.

/// How the level queues: queues, hand size, queue length limit.
pub struct Queuing {
    pub queues: u32,
    pub hand_size: u32,
    pub queue_length: u32,
}

/// The plugin configuration (no suggested defaults); the FlowSchema has non-resource rules and,
/// with `resource_rules`, resource rules too (both match everything).
pub fn one_level_json(name: &str, seats: u32, q: Queuing, resource_rules: bool) -> String {
    let Queuing { queues, hand_size, queue_length } = q;
    let resources = if resource_rules {
        r#",
                                 "resourceRules": [ { "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"] } ]"#
    } else {
        ""
    };
    format!(
        r#"{{ "serverConcurrencyLimit": {seats}, "suggestedDefaults": false,
             "policy": [
               {{ "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
                  "metadata": {{ "name": "{name}", "uid": "pl-{name}" }},
                  "spec": {{ "type": "Limited", "limited": {{ "nominalConcurrencyShares": 95, "lendablePercent": 0, "borrowingLimitPercent": 0,
                    "limitResponse": {{ "type": "Queue", "queuing": {{ "queues": {queues}, "handSize": {hand_size}, "queueLengthLimit": {queue_length} }} }} }} }} }},
               {{ "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                  "metadata": {{ "name": "{name}", "uid": "fs-{name}" }},
                  "spec": {{ "priorityLevelConfiguration": {{ "name": "{name}" }}, "matchingPrecedence": 500,
                    "distinguisherMethod": {{ "type": "ByUser" }},
                    "rules": [ {{ "subjects": [ {{ "kind": "Group", "group": {{ "name": "system:authenticated" }} }} ],
                                 "nonResourceRules": [ {{ "verbs": ["*"], "nonResourceURLs": ["*"] }} ]{resources} }} ] }} }}
             ] }}"#
    )
}
