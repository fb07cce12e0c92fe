# The classic line-based merge of pg_dump --column-inserts output into multi-row INSERTs, re-created for the
# baseline of bench_e2e.py. It follows the algorithm of the merge step of CFEngine Enterprise's federated reporting
# (masterfiles templates/federated_reporting/50-merge_inserts.awk): fields split on the keywords INSERT INTO and
# VALUES; consecutive INSERT lines into the same table become one statement of up to 10000 rows; any other line
# ends the statement and passes through. Like the original it assumes one row per line: a value containing a newline
# (or the words INSERT INTO / VALUES) is not merged correctly. Usage: awk -f merge_inserts.awk < dump.sql
BEGIN {
    FS = "(INSERT INTO|VALUES)"
    ORS = ""
    max_rows = 10000
    current = ""
    rows = 0
}

function finish_statement() {
    if (current != "") {
        print ";\n"
        current = ""
        rows = 0
    }
}

/^INSERT INTO/ && NF == 3 {
    # $2 is " table (columns) ", $3 is " (values);"
    split($2, words, " ")
    tuple = $3
    sub(/;[ \t]*$/, "", tuple)
    if (words[1] == current && rows < max_rows) {
        print ",\n" tuple
        rows++
        next
    }
    finish_statement()
    print "INSERT INTO" $2 "VALUES\n" tuple
    current = words[1]
    rows = 1
    next
}

{
    finish_statement()
    print $0 "\n"
}

END {
    finish_statement()
}
