module dec
go 1.24
