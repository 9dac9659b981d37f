"""GPU kernel templates (Triton).

Each module here holds one ``@triton.jit`` template plus the plain-Python glue the build and the
runtime need (argument order, signature, constexpr mapping, grid, argument packing).  Importing this
package does not import triton; importing a template module does.
"""
