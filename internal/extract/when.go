package extract

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// WhenCostLimit bounds the runtime cost of a delivery's `when` conditions together
// (cel-go's cost units: roughly one per operation, plus one per few characters of a
// string compared or built). It lets a condition look through a few thousand forEach
// items and refuses one whose cost grows with the square of the payload, so that no
// delivery can make the receiver spin (decisions.md "Route conditions").
const WhenCostLimit = 1_000_000

// whenEnvs are the two expression environments: a route's and a plain operation's
// `when` see `payload`; a forEach operation's also sees `item`. Built once for
// providers without spec.states: an Env is immutable and safe for concurrent use.
var whenEnvs = sync.OnceValues(func() ([2]*cel.Env, error) { return newWhenEnvs(nil) })

// newWhenEnvs builds the environments whose jobState() reads states through table.
func newWhenEnvs(table States) (envs [2]*cel.Env, err error) {
	base := []cel.EnvOption{
		cel.Variable("payload", cel.MapType(cel.StringType, cel.DynType)),
		cel.CustomTypeAdapter(jsonAdapter{types.DefaultTypeAdapter}),
		cel.CrossTypeNumericComparisons(true),
		cel.Function("jobState",
			cel.Overload("jobState_string", []*cel.Type{cel.StringType}, cel.StringType,
				cel.UnaryBinding(func(v ref.Val) ref.Val { return jobStateBinding(table, v) }))),
	}
	if envs[0], err = cel.NewEnv(base...); err != nil {
		return envs, err
	}
	envs[1], err = envs[0].Extend(cel.Variable("item", cel.DynType))
	return envs, err
}

// jobStateBinding is States.Resolve for expressions: "success", "completed" and
// "COMPLETED" all read "Succeeded", and a state spec.states maps reads as it maps it
// (possibly "Ignored"), so a condition matches exactly the jobs the JobCompletion
// operation records in that state. An unmapped state is an evaluation error that the
// condition's caller recognises (unmappedIn): the operation is not produced and the
// event shows the state as unmapped, never a 400.
func jobStateBinding(table States, v ref.Val) ref.Val {
	s, ok := v.Value().(string)
	if !ok {
		return types.NewErr("jobState: want a string, got %s", v.Type().TypeName())
	}
	st, ok := table.Resolve(s)
	if !ok {
		return types.NewErr("%s%q", unmappedPrefix, truncate(s))
	}
	return types.String(string(st))
}

// jsonAdapter hands a decoded payload to CEL as it is: payload.Decode keeps numbers
// as json.Number (exact large IDs), which CEL reads as an int when the number is an
// integer that fits and as a double otherwise. Maps and lists are wrapped, not copied,
// so an expression that reads one field costs one field.
type jsonAdapter struct{ types.Adapter }

func (a jsonAdapter) NativeToValue(v any) ref.Val {
	// Maps and lists carry this adapter, so that their nested numbers are read the
	// same way at any depth (the default adapter would wrap them with itself).
	switch v := v.(type) {
	case map[string]any:
		return types.NewStringInterfaceMap(a, v)
	case []any:
		return types.NewDynamicList(a, v)
	}
	if n, ok := v.(json.Number); ok {
		if i, err := n.Int64(); err == nil {
			return types.Int(i)
		}
		f, err := n.Float64()
		if err != nil {
			return types.NewErr("number %s is out of range", truncate(n.String()))
		}
		return types.Double(f)
	}
	return a.Adapter.NativeToValue(v)
}

// condition is a compiled `when` expression and where it sits in the spec, for errors.
type condition struct {
	field    string
	withItem bool
	prg      cel.Program
}

// when compiles an optional `when` expression; withItem adds the forEach item. The
// expression must type-check to bool: a dyn result (a bare payload field) would turn
// a sender's typo into a silent false, so it must be compared explicitly.
func (c *compiler) when(field, text string, withItem bool) *condition {
	if text == "" {
		return nil
	}
	envs, err := c.envs()
	if err != nil {
		c.fail("%s: the expression environment could not be built: %v", field, err)
		return nil
	}
	env := envs[0]
	if withItem {
		env = envs[1]
	}
	ast, iss := env.Compile(text)
	if iss.Err() != nil {
		c.fail("%s: %v", field, iss.Err())
		return nil
	}
	if !ast.OutputType().IsExactType(cel.BoolType) {
		c.fail("%s: the expression's type is %s, want bool (compare a field explicitly, e.g. payload.data.charge == true)",
			field, ast.OutputType())
		return nil
	}
	prg, err := env.Program(ast, cel.CostLimit(WhenCostLimit), cel.InterruptCheckFrequency(100))
	if err != nil {
		c.fail("%s: %v", field, err)
		return nil
	}
	return &condition{field: field, withItem: withItem, prg: prg}
}

// holds evaluates the condition; item is the forEach item (unused without forEach).
// spent is the delivery's cost so far, to which this evaluation's cost is added: the
// limit bounds all the conditions of one delivery together, so that a forEach
// condition over each of many items cannot add up to quadratic work either. Every
// failure (a missing key, a wrong type, the cost limit) is an
// ErrInvalidEvent naming the field: the payload does not fit the route's condition.
// The message names the field and cel-go's error, which names keys and types, not
// payload values. A jobState() of an unmapped state is an *UnmappedError instead.
func (w *condition) holds(doc, item any, spent *uint64) (bool, error) {
	vars := map[string]any{"payload": doc}
	if w.withItem {
		vars["item"] = item
	}
	out, det, err := w.prg.Eval(vars)
	if det != nil && det.ActualCost() != nil {
		*spent += *det.ActualCost()
	}
	if err != nil {
		if u := unmappedIn(w.field, err); u != nil {
			return false, u
		}
		return false, &FieldError{Path: w.field, Problem: "the condition could not be evaluated on this payload", Condition: true,
			message: fmt.Sprintf("%s could not be evaluated: %v", w.field, err)}
	}
	if *spent > WhenCostLimit {
		return false, &FieldError{Path: w.field, Problem: "the conditions of this delivery exceed the cost limit", Condition: true,
			message: fmt.Sprintf("%s could not be evaluated: the conditions of this delivery exceed the cost limit of %d together", w.field, WhenCostLimit)}
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, invalid("%s evaluated to %s, want bool", w.field, out.Type().TypeName())
	}
	return b, nil
}
