//! Debug dump formats (`apf_controller_debug.go`). Expected strings are derived by hand from Go's
//! tabwriter rules (minwidth 8, padding 1): each column is as wide as its widest cell + 1
//! (at least 8); the last cell of each line is not padded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::observe::dumps::*;

#[test]
fn priority_levels_sorted_and_aligned() {
    let rows = vec![
        PriorityLevelRow {
            name: "workload-low".into(),
            active_queues: 3,
            is_idle: false,
            is_quiescing: false,
            waiting: 5,
            executing: 7,
            dispatched: 100,
            rejected: 4,
            timedout: 0,
            cancelled: 1,
        },
        PriorityLevelRow { name: "exempt".into(), is_idle: true, executing: 2, dispatched: 10, ..Default::default() },
    ];
    let expected = concat!(
        "PriorityLevelName, ActiveQueues, IsIdle, IsQuiescing, WaitingRequests, ExecutingRequests, DispatchedRequests, RejectedRequests, TimedoutRequests, CancelledRequests\n",
        "exempt,            0,            true,   false,       0,               2,                 10,                 0,                0,                0\n",
        "workload-low,      3,            false,  false,       5,               7,                 100,                4,                0,                1\n",
    );
    assert_eq!(dump_priority_levels(&rows), expected);
}

#[test]
fn priority_levels_empty() {
    assert_eq!(
        dump_priority_levels(&[]),
        "PriorityLevelName, ActiveQueues, IsIdle, IsQuiescing, WaitingRequests, ExecutingRequests, DispatchedRequests, RejectedRequests, TimedoutRequests, CancelledRequests\n"
    );
}

#[test]
fn queues() {
    let rows = vec![
        QueueRow {
            level: "global-default".into(),
            index: 0,
            pending: 1,
            executing: 2,
            seats_in_use: 3,
            next_dispatch_r: "0.00300000ss".into(),
            initial_seats_sum: 1,
            max_seats_sum: 1,
            total_work_sum: "0.00300000ss".into(),
        },
        QueueRow {
            level: "global-default".into(),
            index: 1,
            next_dispatch_r: "12.50000000ss".into(),
            total_work_sum: "0.00000000ss".into(),
            ..Default::default()
        },
    ];
    // widths: 19, 8, 17, 19, 12, 15, 17, 13 (last column unpadded)
    let expected = concat!(
        "PriorityLevelName, Index,  PendingRequests, ExecutingRequests, SeatsInUse, NextDispatchR, InitialSeatsSum, MaxSeatsSum, TotalWorkSum\n",
        "global-default,    0,      1,               2,                 3,          0.00300000ss,  1,               1,           0.00300000ss\n",
        "global-default,    1,      0,               0,                 0,          12.50000000ss, 0,               0,           0.00000000ss\n",
    );
    assert_eq!(dump_queues(&rows), expected);
}

fn request_rows() -> Vec<RequestRow> {
    vec![
        RequestRow {
            level: "workload-low".into(),
            flow_schema: "service-accounts".into(),
            queue_index: 3,
            index_in_queue: 0,
            flow_distinguisher: "system:serviceaccount:ns:sa".into(),
            arrive_time_ns_unix: 1_700_000_000_123_456_789,
            initial_seats: 1,
            final_seats: 1,
            additional_latency: "0s".into(),
            start_time_ns_unix: None,
            details: Some(RequestDetails {
                user_name: "system:serviceaccount:ns:sa".into(),
                verb: "list".into(),
                api_path: "/apis/apps/v1/namespaces/ns/deployments".into(),
                namespace: "ns".into(),
                name: "".into(),
                api_group: "apps".into(),
                api_version: "v1".into(),
                resource: "deployments".into(),
                subresource: "".into(),
            }),
        },
        RequestRow {
            level: "exempt".into(),
            flow_schema: "exempt".into(),
            queue_index: -1,
            index_in_queue: -1,
            flow_distinguisher: "".into(),
            arrive_time_ns_unix: 1_700_000_000_000_000_000,
            initial_seats: 1,
            final_seats: 1,
            additional_latency: "0s".into(),
            start_time_ns_unix: Some(1_700_000_001_500_000_000),
            details: None,
        },
    ]
}

#[test]
fn requests_without_details() {
    let expected = concat!(
        "PriorityLevelName, FlowSchemaName,   QueueIndex, RequestIndexInQueue, FlowDistingsher,             ArriveTime,                     InitialSeats, FinalSeats, AdditionalLatency, StartTime\n",
        "workload-low,      service-accounts, 3,          0,                   system:serviceaccount:ns:sa, 2023-11-14T22:13:20.123456789Z, 1,            1,          0s,                0001-01-01T00:00:00Z\n",
        "exempt,            exempt,           -1,         -1,                  ,                            2023-11-14T22:13:20Z,           1,            1,          0s,                2023-11-14T22:13:21.5Z\n",
    );
    assert_eq!(dump_requests(&request_rows(), false), expected);
}

#[test]
fn requests_with_details() {
    let out = dump_requests(&request_rows(), true);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3);
    // StartTime becomes an aligned column (width 23 = "2023-11-14T22:13:21.5Z," + 1) and the
    // details follow; the last column (SubResource) is not padded.
    assert!(lines[0].ends_with(
        "StartTime,              UserName,                    Verb,   APIPath,                                 Namespace, Name,   APIVersion, Resource,    SubResource"
    ), "{}", lines[0]);
    assert!(lines[1].ends_with(
        "0001-01-01T00:00:00Z,   system:serviceaccount:ns:sa, list,   /apis/apps/v1/namespaces/ns/deployments, ns,        ,       apps/v1,    deployments, "
    ), "{}", lines[1]);
    assert!(lines[2].ends_with(
        "2023-11-14T22:13:21.5Z, ,                            ,       ,                                        ,          ,       ,           ,            "
    ), "{}", lines[2]);
    assert!(out.ends_with('\n'));
}

#[test]
fn group_version_string() {
    assert_eq!(group_version("", "v1"), "v1");
    assert_eq!(group_version("apps", "v1"), "apps/v1");
    assert_eq!(group_version("", ""), "");
}
