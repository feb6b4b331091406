package model

import (
	"fmt"
	"strconv"
	"strings"
)

// Bucket is one EC2 throttling token bucket: it holds at most Capacity
// tokens and gains Refill tokens a second.
type Bucket struct {
	Capacity int
	Refill   float64
}

// Budget is the EC2 token buckets Reaper's calls draw on, per account and
// Region, shared with every other tool in the account.
type Budget struct {
	// Describe: DescribeInstances requests with a filter (Reaper's are).
	Describe Bucket
	// Terminate: TerminateInstances requests.
	Terminate Bucket
	// TerminateInstances: instances named in TerminateInstances.
	TerminateInstances Bucket
	// CreateTags: CreateTags requests (the Pod-written tag).
	CreateTags Bucket
}

// PublishedBudget is EC2's default, from "Request throttling for the Amazon
// EC2 API" (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html):
// non-mutating actions 100 then 20/s; TerminateInstances, an uncategorized
// action, 100 then 5/s, and its resource bucket 1,000 instances then 20/s;
// CreateTags, which the page does not list on its own, the bucket of
// mutating actions, 50 then 5/s.
func PublishedBudget() Budget {
	return Budget{
		Describe:           Bucket{Capacity: 100, Refill: 20},
		Terminate:          Bucket{Capacity: 100, Refill: 5},
		TerminateInstances: Bucket{Capacity: 1000, Refill: 20},
		CreateTags:         Bucket{Capacity: 50, Refill: 5},
	}
}

// Share is the part f of every bucket.
func (b Budget) Share(f float64) Budget {
	s := func(k Bucket) Bucket { return Bucket{Capacity: int(float64(k.Capacity) * f), Refill: k.Refill * f} }
	return Budget{Describe: s(b.Describe), Terminate: s(b.Terminate), TerminateInstances: s(b.TerminateInstances), CreateTags: s(b.CreateTags)}
}

// budgetNames are ParseBudget's bucket names.
var budgetNames = map[string]func(*Budget) *Bucket{
	"describe":            func(b *Budget) *Bucket { return &b.Describe },
	"terminate":           func(b *Budget) *Bucket { return &b.Terminate },
	"terminate-instances": func(b *Budget) *Bucket { return &b.TerminateInstances },
	"create-tags":         func(b *Budget) *Bucket { return &b.CreateTags },
}

// ParseBudget reads buckets that differ from the published ones, for an
// account whose limits AWS has raised: "name=capacity/refill,…" with names
// describe, terminate, terminate-instances and create-tags; unnamed buckets keep the
// published values.
func ParseBudget(s string) (Budget, error) {
	b := PublishedBudget()
	for part := range strings.SplitSeq(s, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		field, known := budgetNames[name]
		capacity, refill, ok2 := strings.Cut(value, "/")
		if !ok || !known || !ok2 {
			return b, fmt.Errorf("%q: want name=capacity/refill with name describe, terminate, terminate-instances or create-tags", part)
		}
		c, err1 := strconv.Atoi(capacity)
		r, err2 := strconv.ParseFloat(refill, 64)
		if err1 != nil || err2 != nil || c < 1 || r <= 0 {
			return b, fmt.Errorf("%q: capacity must be a whole number ≥ 1 and refill a positive number", part)
		}
		*field(&b) = Bucket{Capacity: c, Refill: r}
	}
	return b, nil
}
