//! Classification: FlowSchema matching, flow distinguisher and flow hash (stub: owned by the classify work).
