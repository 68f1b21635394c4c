-- an op result of more than 2^62 bytes is an error at the op's line
local a = input("a", {2147483648, 4})
local b = input("b", {4, 2147483648})
minimize(a:matmul(b):sum()) -- ERROR
