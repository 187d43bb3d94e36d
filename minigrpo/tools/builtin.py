"""Two tools a model can compute with: ``python`` (runs a script) and ``calculator`` (evaluates arithmetic).

Plain typed functions with Google-style docstrings, so ``transformers.utils.get_json_schema(python)`` gives the
schema a chat template shows the model, as TRL's ``tools=[...]`` expects. Both return text, errors included: a
tool's answer goes back to the model as a message, and an error message is an answer it can learn from.

**Resource limits, not a security sandbox.** ``python`` runs the model's code in a fresh interpreter, never in
the trainer's process, in an empty temporary directory, with a time limit, a memory limit and an output budget
(isolation.run_python). That stops a runaway loop, a memory bomb or a flood of output from touching the run; it
does not stop code from reading or writing the user's files by absolute path, or from using the network. Run
untrusted models' code on a machine (or container) where that is acceptable.

``calculator`` never evaluates text: it parses the expression with ``ast`` and walks the tree, allowing numbers,
+ - * / // % **, unary minus and parentheses, with caps on the expression's length, the exponent and the size of
every intermediate result, so ``9**9**9**9`` is an error message, not a hang.
"""

import ast
import math
import operator

from ..sandbox.isolation import run_python

__all__ = ["python", "calculator", "PYTHON_TIMEOUT", "PYTHON_MEMORY_BYTES", "PYTHON_OUTPUT_CHARS"]

PYTHON_TIMEOUT = 10.0  # seconds of wall-clock time per script
PYTHON_MEMORY_BYTES = 512 << 20  # address space of the script's interpreter
PYTHON_OUTPUT_CHARS = 4000  # stdout and stderr together; the rest is cut, with a note saying so

MAX_EXPRESSION_CHARS = 1000
MAX_RESULT_DIGITS = 1000  # an integer longer than this (anywhere in the computation) is an error
MAX_EXPONENT = 10_000

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def python(code: str) -> str:
    """Run a Python script and return what it prints.

    The script runs in a fresh Python interpreter with the standard library only, in an empty temporary
    directory, for at most 10 seconds and 512 MB of memory; print the values you need. Output (stdout and
    stderr together) is cut to 4000 characters. These are resource limits, not a security sandbox.

    Args:
        code: The Python source to run, as a complete script.
    """
    result = run_python(code, timeout=PYTHON_TIMEOUT, memory_bytes=PYTHON_MEMORY_BYTES,
                        max_output_chars=PYTHON_OUTPUT_CHARS)
    if result.timed_out:
        return result.output + f"\nError: the script ran past its {PYTHON_TIMEOUT:g} s time limit and was stopped."
    if result.output_cut:
        return result.output
    if result.status < 0:  # killed by a signal: most often the memory limit
        return f"{result.output}\nError: the script was killed (signal {-result.status}); it may be out of memory."
    if result.status and not result.output:  # an uncaught exception exits 1 with its traceback as the output
        return f"Error: the script exited with status {result.status} and printed nothing."
    return result.output or "(the script printed nothing)"


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model reads."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Numbers, + - * / // % ** (power), unary minus and parentheses; no names or functions.
    Example: "(3 + 4) * 12 / 7" returns "12.0".

    Args:
        expression: The arithmetic expression to evaluate.
    """
    try:
        return _format(evaluate_arithmetic(expression))
    except CalculatorError as exc:
        return f"Error: {exc}"


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of ``expression`` (see ``calculator``); raises CalculatorError for anything not allowed."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CalculatorError("not a valid arithmetic expression") from None
    try:
        return _value(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large") from None
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def _value(node) -> int | float:
    """Walk the tree: only number literals, the allowed operators and unary plus/minus."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    raise CalculatorError(f"{type(node).__name__} is not allowed (numbers, + - * / // % ** and parentheses only)")


def _check_power(base, exponent) -> None:
    """Refuse a power whose result would be too large *before* computing it (9**9**9 has 369 million digits)."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log10(abs(base)) > MAX_RESULT_DIGITS:
            raise CalculatorError(f"result longer than {MAX_RESULT_DIGITS} digits")
    if isinstance(exponent, float) and base < 0:
        raise CalculatorError("a negative number to a fractional power is not a real number")


def _checked(value):
    """Refuse an integer too long (its digits are cheap to count: bit_length) or a float that overflowed."""
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_DIGITS * 3.33:
        raise CalculatorError(f"result longer than {MAX_RESULT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result too large")
    return value


def _format(value) -> str:
    """Integers in full; floats as Python writes them (``12.0``, ``0.1``, ``1e+20``)."""
    return str(value) if isinstance(value, int) else repr(value)
