-- matmul whose inner dimensions differ
local x = input("x", {4, 8})
local w = param("w", {9, 16}, normal(0.02))
local y = x:matmul(w) -- ERROR
minimize(y:sum())
